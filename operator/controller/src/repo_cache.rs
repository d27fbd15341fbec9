//! The operator's repository cache: a non-bare clone per project (and per
//! use) under the operator's work directory, its default branch mirrored from
//! the project's remote before every use. The Materializer reads approved
//! change sets from it; the Job Site builds in it and lands from it.
//!
//! Credentials (docs/repositories.md): a clone's `origin` records only *which*
//! Secret it authenticates with (`remote.origin.protobotCredentials`, see
//! [`protobot_repo::remote::bind_secret`]); every fetch and push reads the
//! Secret through [`SecretResolver`] and forgets it when the operation ends.
//! The URL written to `.git/config` is the Project's, which may carry no
//! credentials ([`protobot_repo::remote::RemoteUrl::parse`]).
//!
//! Layout: every clone lives at `<root>/<namespace>/<project>/<use>`. Every
//! caller knows its Project and passes the Secret it names ([`project_secret`])
//! to [`mirror_with`].

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use protobot_repo::{
    land::{LandError, fetch_refspecs},
    remote::{
        AccessError, Credentials, RemoteUrl, ResolveCredentials, SecretRef, bind_secret,
        install_resolver,
    },
};

/// The clone URL of a project's `repoUrl` (`file://` stripped for local paths), once
/// `policy` allows its location: every controller that clones a Project's repository —
/// Project status, registration of ChangeSets and BugReports, the Job Site — asks here,
/// so a path on the operator's filesystem is read only by an operator started with
/// `--allow-local-repositories`.
pub fn clone_url(
    repo_url: &str,
    policy: crate::project::decide::RepositoryPolicy,
) -> Result<String, MirrorError> {
    crate::project::decide::validate_location(repo_url, policy)
        .map_err(|reason| MirrorError::Location { reason })?;
    Ok(crate::changeset::local_repository(repo_url)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| repo_url.to_string()))
}

/// Why a clone could not be brought up to its remote.
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    /// The cache directory could not be created.
    #[error("failed to create the repository cache directory {path}: {source}")]
    CreateDir {
        /// Directory.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A local git operation on the clone failed.
    #[error("failed to {operation} in the repository cache {path}: {source}")]
    Git {
        /// Operation.
        operation: &'static str,
        /// Clone.
        path: PathBuf,
        /// Cause.
        #[source]
        source: git2::Error,
    },
    /// The Project names a location this operator does not read (see
    /// [`crate::project::decide::validate_location`]); nothing was cloned.
    #[error("{reason}")]
    Location {
        /// What is wrong and what to do, credentials redacted.
        reason: String,
    },
    /// Fetching from the remote failed (credentials, host key, network).
    #[error("{source}")]
    Fetch {
        /// Cause.
        #[source]
        source: LandError,
    },
}

impl MirrorError {
    /// The access problem (credentials refused, host key changed, ...), when that is
    /// why the mirror failed.
    pub fn access(&self) -> Option<&AccessError> {
        match self {
            MirrorError::Fetch {
                source: LandError::Access { source, .. },
            } => Some(source),
            _ => None,
        }
    }
}

/// Clones the project (once) and brings its default branch up to the remote's,
/// authenticating with `secret` (read for each fetch, never stored).
pub fn mirror_with(
    url: &str,
    branch: &str,
    dir: &Path,
    secret: Option<&SecretRef>,
) -> Result<(), MirrorError> {
    let git = |operation: &'static str| {
        let path = dir.to_path_buf();
        move |source| MirrorError::Git {
            operation,
            path,
            source,
        }
    };
    let (repo, fresh) = match git2::Repository::open(dir) {
        Ok(r) => (r, false),
        Err(_) => {
            std::fs::create_dir_all(dir).map_err(|source| MirrorError::CreateDir {
                path: dir.to_path_buf(),
                source,
            })?;
            (
                git2::Repository::init(dir).map_err(git("create the clone"))?,
                true,
            )
        }
    };
    match repo.find_remote("origin") {
        Ok(r) if r.url().ok() == Some(url) => {}
        Ok(_) => repo
            .remote_set_url("origin", url)
            .map_err(git("point origin at the Project's URL"))?,
        Err(_) => {
            repo.remote("origin", url).map_err(git("add origin"))?;
        }
    }
    bind_secret(&repo, "origin", secret).map_err(git("record the credentials Secret"))?;
    let remote_ref = format!("refs/heads/{branch}");
    let tracking = format!("refs/remotes/origin/{branch}");
    let never_fetched = repo
        .references_glob("refs/remotes/origin/*")
        .map_err(git("list tracking refs"))?
        .next()
        .is_none();
    // The first fetch takes every branch, as a clone would; later ones the default branch.
    let refspec = if never_fetched {
        "+refs/heads/*:refs/remotes/origin/*".to_owned()
    } else {
        format!("+{remote_ref}:{tracking}")
    };
    tracing::debug!(url, secret = ?secret.map(ToString::to_string), dir = %dir.display(), "fetching the default branch");
    fetch_refspecs(&repo, "origin", &[refspec]).map_err(|source| MirrorError::Fetch { source })?;
    let head = match repo.find_reference(&tracking) {
        Ok(r) => r.target(),
        Err(e) if e.code() == git2::ErrorCode::NotFound => None,
        Err(e) => return Err(git("read the tracking ref")(e)),
    };
    if let Some(head) = head {
        // The remote is the truth; the clone's default branch only mirrors it.
        repo.reference(
            &remote_ref,
            head,
            true,
            "protobot: mirror the default branch",
        )
        .map_err(git("mirror the default branch"))?;
        if fresh {
            repo.set_head(&remote_ref).map_err(git("set HEAD"))?;
            repo.checkout_head(Some(git2::build::CheckoutBuilder::new().force()))
                .map_err(git("check out the default branch"))?;
        }
    }
    Ok(())
}

/// The Secret a Project's git transport authenticates with: `spec.credentialsSecretRef`, in
/// the Project's namespace, or, for an `https://` repository of a Project with a GitHub
/// forge, the forge's identity (its token serves git too: [`crate::forge::git_secret`]).
pub fn project_secret(namespace: &str, project: &protobot_api::Project) -> Option<SecretRef> {
    crate::forge::git_secret(namespace, project)
}

/// A Secret as read for one use: its data and its identity (to tell a changed Secret).
pub struct ReadSecret {
    /// `data`, decoded.
    pub data: BTreeMap<String, Vec<u8>>,
    /// `metadata.uid`.
    pub uid: Option<String>,
    /// `metadata.resourceVersion`.
    pub resource_version: Option<String>,
}

/// Why a Secret could not be read (never its content).
#[derive(Debug, thiserror::Error)]
#[error(
    "{source}; check that the operator's ServiceAccount may get Secrets in {namespace} (the chart's RBAC grants get on secrets)"
)]
pub struct ReadSecretError {
    namespace: String,
    #[source]
    source: kube::Error,
}

/// Reads `secret` (`None`: it does not exist): the one path repository credentials and
/// forge identities are read through.
pub async fn read_secret(
    client: &Client,
    secret: &SecretRef,
) -> Result<Option<ReadSecret>, ReadSecretError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &secret.namespace);
    let found = api
        .get_opt(&secret.name)
        .await
        .map_err(|source| ReadSecretError {
            namespace: secret.namespace.clone(),
            source,
        })?;
    Ok(found.map(|s| ReadSecret {
        data: s
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect(),
        uid: s.metadata.uid,
        resource_version: s.metadata.resource_version,
    }))
}

// === SecretResolver ===

/// Reads credentials Secrets from the API server, once per git operation. Git runs
/// on blocking threads (the engine's git work runs on the blocking pool), so
/// each read runs on a short-lived thread of its own driven by the runtime's handle.
#[derive(Clone)]
pub struct SecretResolver {
    client: Client,
    handle: tokio::runtime::Handle,
}

impl SecretResolver {
    /// A resolver using `client` on the runtime of `handle`.
    pub fn new(client: Client, handle: tokio::runtime::Handle) -> SecretResolver {
        SecretResolver { client, handle }
    }

    /// Installs a resolver for `client` as the process's credential source, when
    /// called inside a Tokio runtime (returns whether it was installed).
    pub fn install(client: &Client) -> bool {
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                install_resolver(Arc::new(SecretResolver::new(client.clone(), handle)));
                true
            }
            Err(_) => false,
        }
    }
}

/// A failed Secret read, with what to check.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error(transparent)]
    Api(#[from] ReadSecretError),
    #[error("the thread reading the Secret stopped")]
    Thread,
    #[error("failed to mint a GitHub App installation token for git: {0}")]
    Forge(#[source] protobot_forge::ForgeError),
}

impl ResolveCredentials for SecretResolver {
    fn resolve(&self, secret: &SecretRef, url: &RemoteUrl) -> Result<Credentials, AccessError> {
        let handle = self.handle.clone();
        let unreadable = |source: ReadError| AccessError::SecretUnreadable {
            secret: secret.clone(),
            source: Box::new(source),
        };
        let client = self.client.clone();
        let read = std::thread::scope(|s| {
            let handle = handle.clone();
            s.spawn(move || handle.block_on(async move { read_secret(&client, secret).await }))
                .join()
        });
        let found = read
            .map_err(|_| unreadable(ReadError::Thread))?
            .map_err(|e| unreadable(ReadError::Api(e)))?
            .ok_or_else(|| AccessError::SecretMissing {
                secret: secret.clone(),
            })?;
        // A GitHub App's key Secret: git authenticates with a current installation token
        // (user `x-access-token`), minted by the App's client, never with the key. The
        // Secret's `ca.crt`, when present, is trusted for the host (GitHub Enterprise behind a
        // private CA), as for a token Secret.
        if let Some(app) = crate::forge::app_token_for(secret) {
            let token = std::thread::scope(|s| {
                s.spawn(move || handle.block_on(async move { app.token().await }))
                    .join()
            })
            .map_err(|_| unreadable(ReadError::Thread))?
            .map_err(|e| unreadable(ReadError::Forge(e)))?;
            return Ok(Credentials::Https {
                username: protobot_repo::remote::DEFAULT_TOKEN_USERNAME.to_string(),
                password: token,
                ca: found.data.get(protobot_repo::remote::keys::CA).cloned(),
            });
        }
        Credentials::from_secret_data(secret, url, &found.data)
    }
}

#[cfg(test)]
#[path = "../../repo/tests/support/git_servers.rs"]
#[allow(dead_code, clippy::unwrap_used, clippy::expect_used)]
mod git_servers;

#[cfg(test)]
mod tests {
    use std::sync::{LazyLock, Mutex};

    use super::*;

    #[test]
    fn a_local_location_is_cloned_only_when_the_policy_allows_it() {
        use crate::project::decide::RepositoryPolicy;
        let network = RepositoryPolicy::default();
        let local = RepositoryPolicy { allow_local: true };
        for url in ["file:///srv/git/demo.git", "/srv/git/demo.git", "../demo"] {
            let refused = clone_url(url, network).unwrap_err();
            assert!(matches!(refused, MirrorError::Location { .. }), "{url}");
            assert!(
                refused.to_string().contains("--allow-local-repositories"),
                "{refused}"
            );
        }
        assert_eq!(
            clone_url("file:///srv/git/demo.git", local).unwrap(),
            "/srv/git/demo.git"
        );
        assert_eq!(
            clone_url("https://git.example/demo.git", network).unwrap(),
            "https://git.example/demo.git"
        );
        // An unsupported scheme is refused whatever the policy.
        let bad = clone_url("ftp://git.example/demo.git", local).unwrap_err();
        assert!(matches!(bad, MirrorError::Location { .. }), "{bad}");
    }

    /// A Secret's `data`.
    type SecretData = BTreeMap<String, Vec<u8>>;

    /// Secrets by reference, as the API server would hold them.
    static SECRETS: LazyLock<Mutex<BTreeMap<SecretRef, SecretData>>> =
        LazyLock::new(Mutex::default);

    struct TestSecrets;

    impl ResolveCredentials for TestSecrets {
        fn resolve(&self, secret: &SecretRef, url: &RemoteUrl) -> Result<Credentials, AccessError> {
            let secrets = SECRETS.lock().unwrap_or_else(|e| e.into_inner());
            let data = secrets
                .get(secret)
                .ok_or_else(|| AccessError::SecretMissing {
                    secret: secret.clone(),
                })?;
            Credentials::from_secret_data(secret, url, data)
        }
    }

    /// Every event's message and fields, as text (a minimal subscriber: the crate has no
    /// tracing-subscriber).
    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<String>>);

    struct Fields<'a>(&'a mut String);

    impl tracing::field::Visit for Fields<'_> {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            self.0.push_str(&format!(" {}={value:?}", field.name()));
        }
    }

    impl tracing::Subscriber for Capture {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            let mut line = String::new();
            span.record(&mut Fields(&mut line));
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push_str(&line);
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, values: &tracing::span::Record<'_>) {
            let mut line = String::new();
            values.record(&mut Fields(&mut line));
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push_str(&line);
        }
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            let mut line = String::new();
            event.record(&mut Fields(&mut line));
            line.push('\n');
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push_str(&line);
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    /// The Job Site's mirror over HTTPS with the Project's Secret: the clone is made and
    /// kept current; a wrong password is an access error naming the Secret, and neither
    /// the clone's files nor any log line (debug included) nor the condition message holds
    /// the password.
    #[test]
    fn mirror_over_https_keeps_the_credential_out_of_the_clone_and_the_logs() {
        let Some(servers) = git_servers::GitServers::start() else {
            return;
        };
        install_resolver(Arc::new(TestSecrets));
        let good = SecretRef::new("team-h18", "shop-git");
        let bad = SecretRef::new("team-h18", "shop-git-wrong");
        let wrong = "wrong-password-9f8e7d";
        {
            let mut secrets = SECRETS.lock().unwrap_or_else(|e| e.into_inner());
            secrets.insert(good.clone(), servers.https_secret(&servers.password));
            secrets.insert(bad.clone(), servers.https_secret(wrong));
        }
        let tmp = git_servers::Scratch::new();
        let dir = tmp.path().join("team-h18/shop/repo");
        let url = servers.https_url.clone();
        let capture = Capture::default();
        let (ok, refused) = tracing::subscriber::with_default(capture.clone(), || {
            let ok = mirror_with(&url, "main", &dir, Some(&good)).map_err(|e| e.to_string());
            let refused = mirror_with(
                &url,
                "main",
                &tmp.path().join("team-h18/shop/other"),
                Some(&bad),
            );
            if let Err(e) = &refused {
                // What the controllers log for a failed mirror.
                tracing::warn!(error = %e, detail = ?e, "could not mirror the repository");
            }
            (ok, refused)
        });
        assert_eq!(ok, Ok(()));
        let repo = git2::Repository::open(&dir).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            repo.refname_to_id("refs/heads/main").ok(),
            Some(servers.main_head())
        );
        assert!(dir.join("README").is_file(), "a fresh clone is checked out");
        let e = refused.expect_err("a wrong password is refused");
        let access = e
            .access()
            .unwrap_or_else(|| panic!("an access error: {e:?}"));
        let failure = crate::project::decide::RepoFailure::of(access);
        assert_eq!(failure.reason(), "AuthenticationFailed");
        assert!(
            e.to_string().contains("Secret team-h18/shop-git-wrong"),
            "{e}"
        );
        let logs = capture.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert!(
            logs.contains("fetching the default branch"),
            "the capture works: {logs}"
        );
        assert!(logs.contains("team-h18/shop-git-wrong"), "{logs}");
        for needle in [servers.password.as_str(), wrong] {
            assert!(
                !logs.contains(needle),
                "a credential is in the logs: {logs}"
            );
            let found = git_servers::files_containing(tmp.path(), needle.as_bytes());
            assert!(found.is_empty(), "a credential is on disk in {found:?}");
            assert!(!e.to_string().contains(needle) && !format!("{e:?}").contains(needle));
        }
    }
}
