#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A repository host that accepts connections and never answers: with the process's git
//! network timeouts (`protobot_repo::timeouts`), a fetch over HTTPS and an ls-remote over SSH
//! fail with an error instead of waiting forever. This file is its own test process (the
//! timeouts are process-wide), configured once with short values.

use std::{
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{Arc, Mutex, Once},
    time::Duration,
};

use protobot_repo::{
    land::{fetch_remote_branch, remote_head},
    timeouts::{NetworkTimeouts, TimeoutError, configure},
};

/// Accepts every connection and holds it open without a byte.
fn black_hole() -> (SocketAddr, Arc<Mutex<Vec<TcpStream>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let held = Arc::new(Mutex::new(Vec::new()));
    let h = held.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            h.lock().unwrap().push(stream);
        }
    });
    (addr, held)
}

fn short_timeouts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        configure(NetworkTimeouts {
            connect: Duration::from_secs(5),
            silence: Duration::from_millis(500),
        })
        .unwrap();
    });
}

fn client(url: &str) -> (tempfile::TempDir, git2::Repository) {
    let dir = tempfile::tempdir().unwrap();
    let repo = git2::Repository::init(dir.path()).unwrap();
    repo.remote("origin", url).unwrap();
    (dir, repo)
}

#[test]
fn a_fetch_from_a_host_that_never_answers_fails_instead_of_hanging() {
    short_timeouts();
    let (addr, held) = black_hole();
    let (_dir, repo) = client(&format!("https://{addr}/team/project.git"));
    let err = fetch_remote_branch(&repo, "origin", "refs/heads/main").unwrap_err();
    assert!(
        !held.lock().unwrap().is_empty(),
        "the fetch never connected: {err}"
    );
    assert!(err.to_string().contains("fetch"), "{err}");
}

#[test]
fn an_ls_remote_over_ssh_to_a_host_that_never_answers_fails_instead_of_hanging() {
    short_timeouts();
    let (addr, held) = black_hole();
    let (_dir, repo) = client(&format!("ssh://git@{addr}/team/project.git"));
    let err = remote_head(&repo, "origin", "refs/heads/main").unwrap_err();
    assert!(
        !held.lock().unwrap().is_empty(),
        "the ls-remote never connected: {err}"
    );
}

#[test]
fn timeouts_cannot_change_once_set() {
    short_timeouts();
    let again = configure(NetworkTimeouts::DEFAULT).unwrap_err();
    assert!(
        matches!(again, TimeoutError::AlreadySet { current } if current.silence == Duration::from_millis(500)),
        "{again}"
    );
}
