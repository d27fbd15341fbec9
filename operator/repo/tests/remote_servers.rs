//! Fetch, clone and the expected-head push over HTTPS (TLS, basic auth) and SSH against
//! real servers on loopback (`support/git_servers.rs`), with credentials from a Secret read
//! per operation; wrong credentials, a changed or unknown host key and an untrusted
//! certificate are refused with errors that name the Secret, and the credential is found
//! nowhere on disk or in an error.

use std::{
    collections::BTreeMap,
    path::Path,
    sync::{Arc, LazyLock, Mutex},
};

use git2::{Oid, Repository, Signature};
use protobot_repo::{
    land::{LandError, fetch_remote_branch, push_with_guard, remote_head},
    remote::{
        AccessError, Credentials, RemoteUrl, ResolveCredentials, SecretRef, bind_secret,
        install_resolver,
    },
};

#[path = "support/git_servers.rs"]
mod git_servers;

use git_servers::{GitServers, files_containing};

/// A Secret's `data`.
type SecretData = BTreeMap<String, Vec<u8>>;

/// Secrets by reference, as the API server would hold them.
static SECRETS: LazyLock<Mutex<BTreeMap<SecretRef, SecretData>>> = LazyLock::new(Mutex::default);

struct TestSecrets;

impl ResolveCredentials for TestSecrets {
    fn resolve(&self, secret: &SecretRef, url: &RemoteUrl) -> Result<Credentials, AccessError> {
        let secrets = SECRETS.lock().unwrap();
        let data = secrets
            .get(secret)
            .ok_or_else(|| AccessError::SecretMissing {
                secret: secret.clone(),
            })?;
        Credentials::from_secret_data(secret, url, data)
    }
}

/// Stores `data` as Secret `test/<name>` and returns its reference.
fn secret(name: &str, data: BTreeMap<String, Vec<u8>>) -> SecretRef {
    install_resolver(Arc::new(TestSecrets));
    let s = SecretRef::new("test", name);
    SECRETS.lock().unwrap().insert(s.clone(), data);
    s
}

/// A fresh repository whose `origin` is `url`, bound to `secret`.
fn client(dir: &Path, url: &str, secret: Option<&SecretRef>) -> Repository {
    let repo = Repository::init(dir).unwrap();
    repo.remote("origin", url).unwrap();
    bind_secret(&repo, "origin", secret).unwrap();
    repo
}

fn commit_on(repo: &Repository, parent: Oid, file: &str) -> Oid {
    let parent = repo.find_commit(parent).unwrap();
    let mut index = git2::Index::new().unwrap();
    index.read_tree(&parent.tree().unwrap()).unwrap();
    let blob = repo.blob(file.as_bytes()).unwrap();
    index
        .add(&git2::IndexEntry {
            ctime: git2::IndexTime::new(0, 0),
            mtime: git2::IndexTime::new(0, 0),
            dev: 0,
            ino: 0,
            mode: 0o100644,
            uid: 0,
            gid: 0,
            file_size: 0,
            id: blob,
            flags: 0,
            flags_extended: 0,
            path: file.as_bytes().to_vec(),
        })
        .unwrap();
    let tree = repo.find_tree(index.write_tree_to(repo).unwrap()).unwrap();
    let sig = Signature::new("t", "t@example.invalid", &git2::Time::new(1, 0)).unwrap();
    repo.commit(None, &sig, &sig, file, &tree, &[&parent])
        .unwrap()
}

/// A root commit on `refs/heads/main` (something to push).
fn orphan_commit(repo: &Repository) -> Oid {
    let sig = Signature::new("t", "t@example.invalid", &git2::Time::new(1, 0)).unwrap();
    let tree = repo
        .find_tree(repo.treebuilder(None).unwrap().write().unwrap())
        .unwrap();
    repo.commit(Some("refs/heads/main"), &sig, &sig, "x", &tree, &[])
        .unwrap()
}

/// Clone (fetch into a fresh repository), fetch again, push with the expected head, and a
/// refused push with a stale head; then the credential is nowhere in the clone.
fn round_trip(servers: &GitServers, url: &str, secret: &SecretRef, credential: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let repo = client(&tmp.path().join("clone"), url, Some(secret));
    let seed = servers.main_head();
    assert_eq!(
        fetch_remote_branch(&repo, "origin", "refs/heads/main").unwrap(),
        Some(seed)
    );
    assert_eq!(
        remote_head(&repo, "origin", "refs/heads/main").unwrap(),
        Some(seed)
    );
    let next = commit_on(&repo, seed, "a.txt");
    repo.reference("refs/heads/main", next, true, "t").unwrap();
    let pushed = push_with_guard(
        &repo,
        "origin",
        "refs/heads/main",
        "refs/heads/main",
        Some(seed),
    )
    .unwrap();
    assert_eq!(pushed, next);
    assert_eq!(servers.main_head(), next, "the server's main moved");
    // A push guarded by the old head is refused and moves nothing.
    let later = commit_on(&repo, next, "b.txt");
    repo.reference("refs/heads/main", later, true, "t").unwrap();
    let stale = push_with_guard(
        &repo,
        "origin",
        "refs/heads/main",
        "refs/heads/main",
        Some(seed),
    )
    .unwrap_err();
    assert!(matches!(stale, LandError::RemoteMoved { .. }), "{stale}");
    assert_eq!(servers.main_head(), next);
    // A second clone sees the pushed head.
    let again = client(&tmp.path().join("again"), url, Some(secret));
    assert_eq!(
        fetch_remote_branch(&again, "origin", "refs/heads/main").unwrap(),
        Some(next)
    );
    // The clones hold the Secret's name, never its content.
    let config = std::fs::read_to_string(tmp.path().join("clone/.git/config")).unwrap();
    assert!(
        config.contains(&format!("protobotCredentials = {secret}")),
        "{config}"
    );
    assert!(
        !files_containing(tmp.path(), secret.name.as_bytes()).is_empty(),
        "the search sees .git/config"
    );
    for needle in [credential, &servers.password] {
        let found = files_containing(tmp.path(), needle.as_bytes());
        assert!(found.is_empty(), "the credential is on disk in {found:?}");
    }
}

#[test]
fn https_clone_fetch_and_guarded_push_with_basic_auth() {
    let Some(servers) = GitServers::start() else {
        return;
    };
    let s = secret("https-ok", servers.https_secret(&servers.password));
    round_trip(&servers, &servers.https_url, &s, &servers.password);
}

#[test]
fn https_token_is_a_password_for_the_secrets_username() {
    let Some(servers) = GitServers::start() else {
        return;
    };
    let mut data = servers.https_secret("unused");
    data.remove("password");
    data.insert("token".into(), servers.password.clone().into_bytes());
    let s = secret("https-token", data);
    let tmp = tempfile::tempdir().unwrap();
    let repo = client(tmp.path(), &servers.https_url, Some(&s));
    assert_eq!(
        fetch_remote_branch(&repo, "origin", "refs/heads/main").unwrap(),
        Some(servers.main_head())
    );
}

#[test]
fn ssh_clone_fetch_and_guarded_push_with_a_key_and_known_hosts() {
    let Some(servers) = GitServers::start() else {
        return;
    };
    let s = secret("ssh-ok", servers.ssh_secret(&servers.known_hosts));
    let key_body = servers
        .ssh_key
        .lines()
        .nth(1)
        .unwrap_or_else(|| panic!("the test key has a body"))
        .to_owned();
    round_trip(&servers, &servers.ssh_url, &s, &key_body);
}

#[test]
fn a_wrong_password_is_refused_naming_the_secret() {
    let Some(servers) = GitServers::start() else {
        return;
    };
    let wrong = "not-the-password-0123";
    let s = secret("https-wrong", servers.https_secret(wrong));
    let tmp = tempfile::tempdir().unwrap();
    let repo = client(tmp.path(), &servers.https_url, Some(&s));
    let e = fetch_remote_branch(&repo, "origin", "refs/heads/main").unwrap_err();
    let LandError::Access { source, .. } = &e else {
        panic!("expected an access error, got {e:?}");
    };
    assert!(
        matches!(source, AccessError::AuthenticationFailed { .. }),
        "{source:?}"
    );
    assert_eq!(e.category(), "authentication-failed");
    let text = e.to_string();
    assert!(text.contains("Secret test/https-wrong"), "{text}");
    assert!(
        text.contains("put a valid token or username/password"),
        "{text}"
    );
    assert!(
        !text.contains(wrong) && !format!("{e:?}").contains(wrong),
        "{text}"
    );
    // The push is refused the same way, and nothing moved.
    let head = servers.main_head();
    orphan_commit(&repo);
    let e = push_with_guard(
        &repo,
        "origin",
        "refs/heads/main",
        "refs/heads/main",
        Some(head),
    )
    .unwrap_err();
    assert_eq!(e.category(), "authentication-failed", "{e}");
    assert!(files_containing(tmp.path(), wrong.as_bytes()).is_empty());
    assert_eq!(servers.main_head(), head);
}

#[test]
fn without_a_secret_the_private_ca_is_untrusted_and_a_secret_without_credentials_is_named() {
    let Some(servers) = GitServers::start() else {
        return;
    };
    // Trust comes from the Secret's ca.crt, so without one the certificate is refused
    // first; with a CA but no credentials the server's 401 is reported.
    let tmp = tempfile::tempdir().unwrap();
    let repo = client(tmp.path(), &servers.https_url, None);
    let e = fetch_remote_branch(&repo, "origin", "refs/heads/main").unwrap_err();
    assert!(
        matches!(e, LandError::Git { .. }),
        "an untrusted certificate without a Secret is a plain TLS failure: {e:?}"
    );
    let mut data = servers.https_secret("x");
    data.remove("password");
    let s = secret("https-no-credentials", data);
    let repo = client(&tmp.path().join("b"), &servers.https_url, Some(&s));
    let e = fetch_remote_branch(&repo, "origin", "refs/heads/main").unwrap_err();
    assert_eq!(e.category(), "credentials-unavailable", "{e}");
    assert!(e.to_string().contains("test/https-no-credentials"), "{e}");
}

#[test]
fn a_certificate_from_another_ca_is_refused() {
    let Some(servers) = GitServers::start() else {
        return;
    };
    let Some(other) = GitServers::start() else {
        return;
    };
    let mut data = servers.https_secret(&servers.password);
    data.insert("ca.crt".into(), other.ca_pem.clone());
    let s = secret("https-other-ca", data);
    let tmp = tempfile::tempdir().unwrap();
    let repo = client(tmp.path(), &servers.https_url, Some(&s));
    let e = fetch_remote_branch(&repo, "origin", "refs/heads/main").unwrap_err();
    assert_eq!(e.category(), "certificate-untrusted", "{e}");
    assert!(e.to_string().contains("ca.crt"), "{e}");
}

#[test]
fn a_changed_host_key_is_refused_with_its_own_error() {
    let Some(servers) = GitServers::start() else {
        return;
    };
    let s = secret(
        "ssh-changed",
        servers.ssh_secret(&servers.other_known_hosts),
    );
    let tmp = tempfile::tempdir().unwrap();
    let repo = client(tmp.path(), &servers.ssh_url, Some(&s));
    let e = fetch_remote_branch(&repo, "origin", "refs/heads/main").unwrap_err();
    let LandError::Access {
        source: AccessError::HostKeyChanged {
            host, fingerprint, ..
        },
        ..
    } = &e
    else {
        panic!("expected a changed host key, got {e:?}");
    };
    assert!(host.starts_with("[127.0.0.1]:"), "{host}");
    assert!(fingerprint.starts_with("SHA256:"), "{fingerprint}");
    let text = e.to_string();
    assert!(
        text.contains("Secret test/ssh-changed") && text.contains("key changed"),
        "{text}"
    );
    // The push never reaches the server either.
    let head = servers.main_head();
    let repo2 = client(&tmp.path().join("p"), &servers.ssh_url, Some(&s));
    assert_ne!(orphan_commit(&repo2), head);
    let e = push_with_guard(
        &repo2,
        "origin",
        "refs/heads/main",
        "refs/heads/main",
        Some(head),
    )
    .unwrap_err();
    assert_eq!(e.category(), "host-key-changed", "{e}");
    assert_eq!(servers.main_head(), head);
}

#[test]
fn an_unknown_host_is_refused() {
    let Some(servers) = GitServers::start() else {
        return;
    };
    let elsewhere = servers
        .known_hosts
        .replacen("[127.0.0.1]", "[127.0.0.2]", 1);
    let s = secret("ssh-unknown", servers.ssh_secret(&elsewhere));
    let tmp = tempfile::tempdir().unwrap();
    let repo = client(tmp.path(), &servers.ssh_url, Some(&s));
    let e = fetch_remote_branch(&repo, "origin", "refs/heads/main").unwrap_err();
    assert_eq!(e.category(), "host-key-unknown", "{e}");
    assert!(e.to_string().contains("ssh-keyscan"), "{e}");
}
