//! A fake GitHub REST API on loopback for the forge's tests: it serves the documented
//! responses (status codes, headers, `Link` pagination, rate-limit and error bodies) from a
//! small in-memory model, records every request, and lets a test script the next answers of a
//! route (a limit, a refusal, a lost answer). [`Fake::serve_repository`] backs its pull
//! requests with a real bare repository (heads follow the pushed branches, the merge endpoint
//! really merges there).
//!
//! Where GitHub is stateful, so is the model, and its refusals follow from that state rather
//! than from a script:
//! - **mergeability is computed in the background**: after a pull request opens, its head is
//!   pushed or its base moves, the next [`Model::unknown_window`] merges answer 405 "Base
//!   branch was modified" and `GET …/pulls/{n}` shows `mergeable: null`;
//! - **head lag**: after a push, the next [`Model::head_lag`] reads and merges still see the
//!   old head (a merge with the new `sha` gets 409);
//! - **branch protection derived from state** ([`Protection`]): required contexts satisfied by
//!   the statuses and check runs stored for the head ("… is expected" until reported,
//!   "… is failing" after a failure), required approvals from the stored reviews, "require
//!   branches to be up to date", allowed merge methods;
//! - **its own merges** move the base, make a distinct merge commit and associate it with the
//!   pull request (`GET …/commits/{sha}/pulls`), after [`Model::association_lag`] reads;
//! - **the issues list mixes in pull requests** (with `pull_request`), as GitHub's does;
//! - **statuses on unknown commits get 422**;
//! - **secondary limits** ([`Model::secondary`]): more than 80 mutations in a minute get 403
//!   "secondary rate limit", and concurrent mutations are counted.
//!
//! Shared: the e2e scenarios (`e2e/tests/forge_github.rs`) include this file by path.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::VecDeque,
    net::SocketAddr,
    path::Path,
    sync::{Arc, Mutex},
};

use axum::{
    Router,
    body::Bytes,
    extract::State,
    http::{HeaderMap, Method, StatusCode, Uri},
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};

pub const OWNER: &str = "acme";
pub const REPO: &str = "widgets";

/// One recorded request.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: Method,
    pub path: String,
    pub query: String,
    pub authorization: Option<String>,
    pub body: Value,
}

/// A scripted answer for the next request with this method whose path contains `path_suffix`.
pub struct Scripted {
    pub method: Method,
    pub path_suffix: String,
    pub status: StatusCode,
    pub headers: Vec<(&'static str, String)>,
    pub body: Value,
    /// Apply the request to the model anyway (a lost answer: done, but reported failed).
    pub apply: bool,
}

/// Reads a branch head from a real repository.
pub type HeadOf = Box<dyn Fn(&str) -> Option<String> + Send>;

/// What a merge does to the model (the engine test merges in a real repository).
pub type MergeHook = Box<dyn Fn(u64, &Value, &Value) -> Result<String, (StatusCode, Value)> + Send>;

/// Branch protection of the base branch, evaluated against the model's state.
#[derive(Clone, Debug, Default)]
pub struct Protection {
    /// Status contexts or check-run names that must have succeeded on the head.
    pub required_contexts: Vec<String>,
    /// Approving reviews (by someone other than the author) required.
    pub required_approvals: usize,
    /// "Require branches to be up to date before merging".
    pub strict: bool,
    /// Allowed `merge_method`s (empty: all).
    pub allowed_methods: Vec<String>,
}

/// What GitHub computes in the background for one pull request.
#[derive(Clone, Debug, Default)]
pub struct PullSim {
    /// Merges still answered "Base branch was modified" (mergeability unknown).
    pub unknown_left: u32,
    /// A pushed head GitHub has not taken in yet, and the reads left until it does.
    pub pending_head: Option<String>,
    pub lag_left: u32,
    /// The base head the pull request's head was last pushed (or opened) against.
    pub base_at_push: Option<String>,
    /// The base head as last seen (a move restarts the mergeability computation).
    pub base_seen: Option<String>,
}

/// The secondary limits the double enforces on mutations.
#[derive(Clone, Debug)]
pub struct SecondaryLimit {
    /// Most mutations in any 60 s.
    pub per_minute: usize,
    /// How long a mutation is "in flight" on the server (virtual time under paused clocks).
    pub service_time: std::time::Duration,
}

impl Default for SecondaryLimit {
    fn default() -> Self {
        SecondaryLimit {
            per_minute: 80,
            service_time: std::time::Duration::from_millis(50),
        }
    }
}

#[derive(Default)]
pub struct Model {
    pub requests: Vec<Recorded>,
    pub pulls: Vec<Value>,
    pub reviews: Vec<(u64, Value)>,
    pub issues: Vec<Value>,
    pub statuses: Vec<(String, Value)>,
    pub commit_pulls: Vec<(String, Value)>,
    pub scripted: VecDeque<Scripted>,
    pub page_size: usize,
    pub next_number: u64,
    pub installation_tokens: Vec<String>,
    /// When set, every installation token minted is this one (a git server behind the
    /// scenario accepts one fixed password); else `ghs_installation<n>`.
    pub fixed_installation_token: Option<String>,
    pub token_lifetime_secs: i64,
    pub merge_hook: Option<MergeHook>,
    /// (branch, commit) pairs `GET …/compare` answers "ahead" for.
    pub contains: Vec<(String, String)>,
    /// Pushed branch heads a new pull request gets as its head.
    pub branch_heads: Vec<(String, String)>,
    /// Reads a branch's head from a real repository (pull-request heads follow it).
    pub head_of: Option<HeadOf>,
    /// The bare repository behind [`Fake::serve_repository`], if any.
    pub repository: Option<std::path::PathBuf>,
    /// Merges answered "Base branch was modified" after a pull request opens or its head is
    /// pushed.
    pub unknown_window: u32,
    /// The same after its base moves.
    pub unknown_after_base_move: u32,
    /// Reads and merges that still see a pull request's old head after a push.
    pub head_lag: u32,
    /// Reads of `commits/{sha}/pulls` that miss the association a merge made.
    pub association_lag: u32,
    /// Associations not visible yet: (merge commit, pull request, reads left).
    pub pending_associations: Vec<(String, Value, u32)>,
    /// Branch protection of every base branch.
    pub protection: Option<Protection>,
    /// Check runs per commit (`{"name", "status", "conclusion"}`).
    pub check_runs: Vec<(String, Value)>,
    /// Commits the double knows besides branch and pull-request heads.
    pub known_commits: Vec<String>,
    /// Background state per pull request.
    pub sim: std::collections::BTreeMap<u64, PullSim>,
    /// Merges the double made itself (for distinct merge commits).
    pub merges_made: u64,
    /// Secondary limits on mutations (`None`: not enforced).
    pub secondary: Option<SecondaryLimit>,
    /// When each mutation arrived (the tokio clock: virtual under paused time).
    pub mutation_times: Vec<tokio::time::Instant>,
    /// Mutations in flight now, and the most ever at once.
    pub in_flight: usize,
    pub max_in_flight: usize,
    /// Mutations refused by the secondary limit.
    pub secondary_refusals: usize,
}

impl Model {
    /// A branch's head: the real repository's, else the pushed one.
    pub fn branch_head(&self, branch: &str) -> Option<String> {
        self.head_of.as_ref().and_then(|f| f(branch)).or_else(|| {
            self.branch_heads
                .iter()
                .rev()
                .find(|(b, _)| b == branch)
                .map(|(_, s)| s.clone())
        })
    }

    /// Whether the double knows commit `sha`.
    pub fn knows(&self, sha: &str) -> bool {
        self.branch_heads.iter().any(|(_, s)| s == sha)
            || self.known_commits.iter().any(|s| s == sha)
            || self.contains.iter().any(|(_, s)| s == sha)
            || self.pulls.iter().any(|p| p["head"]["sha"] == sha)
            || self
                .sim
                .values()
                .any(|s| s.pending_head.as_deref() == Some(sha))
            || self.head_of.is_some() && commit_exists_in_repository(self, sha)
    }

    /// Brings pull request `index` up to date with pushes GitHub has taken in (head lag,
    /// mergeability restarts). `consume`: this request counts against the lag.
    fn refresh(&mut self, index: usize, consume: bool) {
        if self.pulls[index]["state"] != "open" {
            return;
        }
        let number = self.pulls[index]["number"].as_u64().unwrap_or(0);
        let head_ref = self.pulls[index]["head"]["ref"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let base_ref = self.pulls[index]["base"]["ref"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let actual = self.branch_head(&head_ref);
        let base = self.branch_head(&base_ref);
        let recorded = self.pulls[index]["head"]["sha"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let (window, base_window, lag) = (
            self.unknown_window,
            self.unknown_after_base_move,
            self.head_lag,
        );
        let sim = self.sim.entry(number).or_default();
        if base.is_some() && sim.base_seen != base {
            if sim.base_seen.is_some() {
                sim.unknown_left = sim.unknown_left.max(base_window);
            }
            sim.base_seen = base.clone();
        }
        let mut adopt = None;
        if let Some(actual) = actual.filter(|a| *a != recorded) {
            if sim.pending_head.as_deref() != Some(actual.as_str()) {
                sim.pending_head = Some(actual.clone());
                sim.lag_left = lag;
                sim.unknown_left = sim.unknown_left.max(window);
            }
            if sim.lag_left == 0 {
                sim.pending_head = None;
                sim.base_at_push = base.clone();
                adopt = Some(actual);
            } else if consume {
                sim.lag_left -= 1;
            }
        }
        if let Some(sha) = adopt {
            self.pulls[index]["head"]["sha"] = json!(sha);
        }
    }

    /// What branch protection says about merging pull request `index` now (`None`: allowed).
    fn protection_refusal(&self, index: usize, body: &Value) -> Option<String> {
        let protection = self.protection.as_ref()?;
        let pull = &self.pulls[index];
        let number = pull["number"].as_u64().unwrap_or(0);
        let method = body["merge_method"].as_str().unwrap_or("merge");
        if !protection.allowed_methods.is_empty()
            && !protection.allowed_methods.iter().any(|m| m == method)
        {
            return Some(match method {
                "merge" => "Merge commits are not allowed on this repository.".to_string(),
                "squash" => "Squash merges are not allowed on this repository.".to_string(),
                _ => "Rebase merges are not allowed on this repository.".to_string(),
            });
        }
        let author = pull["user"]["login"].as_str().unwrap_or_default();
        let mut latest: std::collections::BTreeMap<String, String> = Default::default();
        for (n, review) in &self.reviews {
            let login = review["user"]["login"].as_str().unwrap_or_default();
            if *n == number && login != author {
                latest.insert(
                    login.to_string(),
                    review["state"].as_str().unwrap_or_default().to_string(),
                );
            }
        }
        let approvals = latest.values().filter(|s| *s == "APPROVED").count();
        if approvals < protection.required_approvals {
            let n = protection.required_approvals;
            return Some(format!(
                "At least {n} approving review{} is required by reviewers with write access.",
                if n == 1 { "" } else { "s" }
            ));
        }
        let head = pull["head"]["sha"].as_str().unwrap_or_default();
        let mut missing = Vec::new();
        for context in &protection.required_contexts {
            match self.check_state(head, context) {
                Some("success") => {}
                Some("failure") => {
                    return Some(format!("Required status check \"{context}\" is failing."));
                }
                _ => missing.push(context.clone()),
            }
        }
        match missing.as_slice() {
            [] => {}
            [one] => return Some(format!("Required status check \"{one}\" is expected.")),
            many => {
                return Some(format!(
                    "{} of {} required status checks are expected.",
                    many.len(),
                    protection.required_contexts.len()
                ));
            }
        }
        if protection.strict {
            let number = pull["number"].as_u64().unwrap_or(0);
            let base_ref = pull["base"]["ref"].as_str().unwrap_or_default();
            let base = self.branch_head(base_ref);
            let up_to_date = match (&self.head_of, &base) {
                (Some(_), Some(base)) => is_ancestor_in_repository(self, base, head),
                (None, Some(base)) => self
                    .sim
                    .get(&number)
                    .and_then(|s| s.base_at_push.as_ref())
                    .is_some_and(|b| b == base),
                _ => true,
            };
            if !up_to_date {
                return Some("Head branch is not up to date with the base branch".to_string());
            }
        }
        None
    }

    /// `success`, `failure` or `pending`/`None` for a context or check run on `sha` (the
    /// latest status wins; a check run counts when completed).
    fn check_state(&self, sha: &str, name: &str) -> Option<&'static str> {
        let status = self
            .statuses
            .iter()
            .rev()
            .find(|(s, b)| s == sha && b["context"] == name)
            .map(|(_, b)| match b["state"].as_str() {
                Some("success") => "success",
                Some("failure" | "error") => "failure",
                _ => "pending",
            });
        let run = self
            .check_runs
            .iter()
            .rev()
            .find(|(s, r)| s == sha && r["name"] == name)
            .map(
                |(_, r)| match (r["status"].as_str(), r["conclusion"].as_str()) {
                    (Some("completed"), Some("success" | "neutral" | "skipped")) => "success",
                    (Some("completed"), Some(_)) => "failure",
                    _ => "pending",
                },
            );
        match (status, run) {
            (Some("success"), _) | (_, Some("success")) => Some("success"),
            (Some("failure"), _) | (_, Some("failure")) => Some("failure"),
            (a, b) => a.or(b),
        }
    }
}

fn commit_exists_in_repository(m: &Model, sha: &str) -> bool {
    m.repository.as_ref().is_some_and(|origin| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(origin)
            .args(["cat-file", "-e", &format!("{sha}^{{commit}}")])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

fn is_ancestor_in_repository(m: &Model, ancestor: &str, head: &str) -> bool {
    m.repository.as_ref().is_none_or(|origin| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(origin)
            .args(["merge-base", "--is-ancestor", ancestor, head])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

#[derive(Clone)]
pub struct Fake {
    pub model: Arc<Mutex<Model>>,
    pub addr: SocketAddr,
}

impl Fake {
    pub async fn start() -> Fake {
        let model = Arc::new(Mutex::new(Model {
            page_size: 100,
            next_number: 1,
            token_lifetime_secs: 3600,
            ..Model::default()
        }));
        let app = Router::new().fallback(handle).with_state(model.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Fake { model, addr }
    }

    /// Pull-request heads follow `origin`'s branches and the merge endpoint merges in it
    /// ([`merge_in`]).
    pub fn serve_repository(&self, origin: &Path) {
        let hook = merge_in(origin);
        let heads = follow_heads(origin);
        self.with(|m| {
            m.merge_hook = Some(hook);
            m.head_of = Some(heads);
            m.repository = Some(origin.to_path_buf());
        });
    }

    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn with<R>(&self, f: impl FnOnce(&mut Model) -> R) -> R {
        f(&mut self.model.lock().unwrap())
    }

    pub fn script(
        &self,
        method: Method,
        path_suffix: &str,
        status: u16,
        headers: &[(&'static str, &str)],
        body: Value,
    ) {
        self.with(|m| {
            m.scripted.push_back(Scripted {
                method,
                path_suffix: path_suffix.to_string(),
                status: StatusCode::from_u16(status).unwrap(),
                headers: headers.iter().map(|(k, v)| (*k, v.to_string())).collect(),
                body,
                apply: false,
            })
        });
    }

    pub fn script_lost(&self, method: Method, path_suffix: &str, status: u16) {
        self.with(|m| {
            m.scripted.push_back(Scripted {
                method,
                path_suffix: path_suffix.to_string(),
                status: StatusCode::from_u16(status).unwrap(),
                headers: Vec::new(),
                body: json!({"message": "Server Error"}),
                apply: true,
            })
        });
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.with(|m| m.requests.clone())
    }

    pub fn requests_to(&self, method: Method, suffix: &str) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == method && r.path.contains(suffix))
            .collect()
    }

    /// A push of `sha` to `branch` (no repository behind): pull requests from it take the
    /// new head after the head lag, those into it restart their mergeability.
    pub fn push(&self, branch: &str, sha: &str) {
        self.with(|m| m.branch_heads.push((branch.to_string(), sha.to_string())));
    }

    /// CI reports `state` for `context` on `sha` (a commit status).
    pub fn report(&self, sha: &str, context: &str, state: &str) {
        self.with(|m| {
            m.statuses.push((
                sha.to_string(),
                json!({"context": context, "state": state, "description": "CI"}),
            ))
        });
    }

    /// A check run `name` on `sha` (`status` `queued`/`in_progress`/`completed`).
    pub fn check_run(&self, sha: &str, name: &str, status: &str, conclusion: Option<&str>) {
        self.with(|m| {
            m.check_runs.push((
                sha.to_string(),
                json!({"name": name, "status": status, "conclusion": conclusion}),
            ))
        });
    }

    /// `login` approves pull request `number` at its head.
    pub fn approve(&self, number: u64, login: &str) {
        self.with(|m| {
            let head = m
                .pulls
                .iter()
                .find(|p| p["number"] == number)
                .map(|p| p["head"]["sha"].clone())
                .unwrap_or(Value::Null);
            m.reviews.push((
                number,
                json!({"user": {"login": login}, "state": "APPROVED", "commit_id": head}),
            ));
        });
    }

    /// The most mutations that arrived within any 60 s (the tokio clock).
    pub fn max_mutations_per_minute(&self) -> usize {
        let times = self.with(|m| m.mutation_times.clone());
        times
            .iter()
            .enumerate()
            .map(|(i, t)| {
                times[i..]
                    .iter()
                    .take_while(|u| **u < *t + std::time::Duration::from_secs(60))
                    .count()
            })
            .max()
            .unwrap_or(0)
    }

    pub fn add_pull(
        &self,
        head: &str,
        base: &str,
        head_sha: &str,
        state: &str,
        merge_commit: Option<&str>,
    ) -> u64 {
        self.with(|m| {
            let number = m.next_number;
            m.next_number += 1;
            m.pulls.push(pull_json(
                number,
                head,
                base,
                head_sha,
                state,
                merge_commit,
                &format!("{OWNER}/{REPO}"),
            ));
            number
        })
    }
}

pub fn pull_json(
    number: u64,
    head: &str,
    base: &str,
    head_sha: &str,
    state: &str,
    merge_commit: Option<&str>,
    head_repo: &str,
) -> Value {
    json!({
        "url": format!("https://api.github.com/repos/{OWNER}/{REPO}/pulls/{number}"),
        "html_url": format!("https://github.com/{OWNER}/{REPO}/pull/{number}"),
        "number": number,
        "state": state,
        "title": "t",
        "user": {"login": "author", "id": 1},
        "merged_at": merge_commit.map(|_| "2026-12-01T00:00:00Z"),
        "merge_commit_sha": merge_commit,
        "head": {"label": format!("{OWNER}:{head}"), "ref": head, "sha": head_sha, "repo": {"full_name": head_repo}},
        "base": {"label": format!("{OWNER}:{base}"), "ref": base, "sha": "0".repeat(40), "repo": {"full_name": format!("{OWNER}/{REPO}")}},
        "extra_field_clients_must_ignore": {"nested": [1, 2, 3]}
    })
}

/// The merge endpoint of a repository: merges `head.sha` into `main` of the bare `origin` (a
/// two-parent merge commit with GitHub's title + message), refusing as GitHub does (409) when
/// the request's `sha` is not the branch's head.
pub fn merge_in(origin: &Path) -> MergeHook {
    use protobot_jobsite::testing::git;
    let origin = origin.to_path_buf();
    Box::new(move |_n: u64, pull: &Value, body: &Value| {
        let head = pull["head"]["ref"].as_str().unwrap();
        let head_sha = git(&origin, &["rev-parse", &format!("refs/heads/{head}")]);
        if body["sha"].as_str() != Some(head_sha.as_str()) {
            return Err((
                StatusCode::CONFLICT,
                json!({"message": "Head branch was modified. Review and try the merge again."}),
            ));
        }
        let main = git(&origin, &["rev-parse", "refs/heads/main"]);
        let tree = git(&origin, &["merge-tree", "--write-tree", &main, &head_sha]);
        let message = format!(
            "{}\n\n{}",
            body["commit_title"].as_str().unwrap_or_default(),
            body["commit_message"].as_str().unwrap_or_default()
        );
        let merge = git(
            &origin,
            &[
                "-c",
                "user.name=GitHub",
                "-c",
                "user.email=noreply@github.com",
                "commit-tree",
                tree.lines().next().unwrap(),
                "-p",
                &main,
                "-p",
                &head_sha,
                "-m",
                &message,
            ],
        );
        git(&origin, &["update-ref", "refs/heads/main", &merge, &main]);
        Ok(merge)
    })
}

/// Branch heads read from the bare `origin`.
pub fn follow_heads(origin: &Path) -> HeadOf {
    let origin = origin.to_path_buf();
    Box::new(move |branch: &str| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(&origin)
            .args([
                "rev-parse",
                "--verify",
                "-q",
                &format!("refs/heads/{branch}"),
            ])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    })
}

/// A merge endpoint where someone merges into `main` of `origin` just before the Job Site's
/// first merge, which GitHub (with "require branches to be up to date") then refuses; later
/// merges are `inner`'s.
pub fn main_moves_once_then(origin: &Path, inner: MergeHook) -> MergeHook {
    use protobot_jobsite::testing::git;
    let origin = origin.to_path_buf();
    let moved = Mutex::new(false);
    Box::new(move |n, pull, body| {
        let mut moved = moved.lock().unwrap();
        if !*moved {
            *moved = true;
            let parent = origin.parent().unwrap();
            let side = parent.join("side");
            git(
                parent,
                &[
                    "clone",
                    "-q",
                    origin.to_str().unwrap(),
                    side.to_str().unwrap(),
                ],
            );
            std::fs::write(side.join("docs/other.md"), "another change\n").unwrap();
            git(&side, &["add", "-A"]);
            git(
                &side,
                &[
                    "-c",
                    "user.name=o",
                    "-c",
                    "user.email=o@example.invalid",
                    "commit",
                    "-qm",
                    "other",
                ],
            );
            git(&side, &["push", "-q", "origin", "main"]);
            return Err((
                StatusCode::METHOD_NOT_ALLOWED,
                json!({"message": "Head branch is not up to date with the base branch"}),
            ));
        }
        inner(n, pull, body)
    })
}

fn query_param<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

fn json_response(status: StatusCode, headers: &[(&'static str, String)], body: &Value) -> Response {
    let mut response = (status, body.to_string()).into_response();
    response.headers_mut().insert(
        "content-type",
        "application/json; charset=utf-8".parse().unwrap(),
    );
    for (k, v) in headers {
        response.headers_mut().insert(*k, v.parse().unwrap());
    }
    response
}

/// A page of `items` with GitHub's `Link` header.
fn paged(base: &str, path: &str, query: &str, items: &[Value], page_size: usize) -> Response {
    let page: usize = query_param(query, "page")
        .and_then(|p| p.parse().ok())
        .unwrap_or(1);
    let start = (page - 1) * page_size;
    let slice: Vec<Value> = items.iter().skip(start).take(page_size).cloned().collect();
    let mut headers = Vec::new();
    let rest: String = query
        .split('&')
        .filter(|kv| !kv.starts_with("page="))
        .collect::<Vec<_>>()
        .join("&");
    let pages = items.len().div_ceil(page_size).max(1);
    let mut links = Vec::new();
    if page < pages {
        links.push(format!(
            "<{base}{path}?{rest}&page={}>; rel=\"next\"",
            page + 1
        ));
        links.push(format!("<{base}{path}?{rest}&page={pages}>; rel=\"last\""));
    }
    if page > 1 {
        links.push(format!("<{base}{path}?{rest}&page=1>; rel=\"first\""));
    }
    if !links.is_empty() {
        headers.push(("link", links.join(", ")));
    }
    headers.push(("x-ratelimit-remaining", "4999".to_string()));
    json_response(StatusCode::OK, &headers, &Value::Array(slice))
}

async fn handle(
    State(model): State<Arc<Mutex<Model>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    let query = uri.query().unwrap_or_default().to_string();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let host = headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let base = format!("http://{host}");
    let mutation = !matches!(method, Method::GET | Method::HEAD);
    let secondary = model.lock().unwrap().secondary.clone();
    if let (true, Some(limit)) = (mutation, &secondary) {
        let refused = {
            let mut m = model.lock().unwrap();
            let now = tokio::time::Instant::now();
            let recent = m
                .mutation_times
                .iter()
                .filter(|t| **t + std::time::Duration::from_secs(60) > now)
                .count();
            m.mutation_times.push(now);
            m.in_flight += 1;
            m.max_in_flight = m.max_in_flight.max(m.in_flight);
            recent >= limit.per_minute
        };
        // The server takes a while: a client that does not wait for the answer overlaps.
        tokio::time::sleep(limit.service_time).await;
        model.lock().unwrap().in_flight -= 1;
        if refused {
            let mut m = model.lock().unwrap();
            m.secondary_refusals += 1;
            return json_response(
                StatusCode::FORBIDDEN,
                &[],
                &json!({"message": "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.", "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits"}),
            );
        }
    }
    let mut m = model.lock().unwrap();
    m.requests.push(Recorded {
        method: method.clone(),
        path: path.clone(),
        query: query.clone(),
        authorization: headers
            .get("authorization")
            .and_then(|h| h.to_str().ok())
            .map(str::to_string),
        body: body.clone(),
    });
    if let Some(i) = m
        .scripted
        .iter()
        .position(|s| s.method == method && path.contains(&s.path_suffix))
    {
        let s = m.scripted.remove(i).unwrap();
        if s.apply {
            let _ = route(&mut m, &base, &method, &path, &query, &body);
        }
        return json_response(s.status, &s.headers, &s.body);
    }
    route(&mut m, &base, &method, &path, &query, &body)
}

fn not_found() -> Response {
    json_response(
        StatusCode::NOT_FOUND,
        &[],
        &json!({"message": "Not Found", "documentation_url": "https://docs.github.com/rest"}),
    )
}

fn route(
    m: &mut Model,
    base: &str,
    method: &Method,
    path: &str,
    query: &str,
    body: &Value,
) -> Response {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let page_size = m.page_size;
    match (method.as_str(), segments.as_slice()) {
        ("POST", ["app", "installations", _id, "access_tokens"]) => {
            let n = m.installation_tokens.len() + 1;
            let token = m
                .fixed_installation_token
                .clone()
                .unwrap_or_else(|| format!("ghs_installation{n}"));
            m.installation_tokens.push(token.clone());
            let expires = jiff::Timestamp::now().as_second() + m.token_lifetime_secs;
            let expires = jiff::Timestamp::from_second(expires).unwrap().to_string();
            json_response(
                StatusCode::CREATED,
                &[],
                &json!({"token": token, "expires_at": expires, "permissions": {"contents": "write"}, "repository_selection": "selected"}),
            )
        }
        ("GET", ["repos", _, _, "commits", sha, "pulls"]) => {
            // Associations GitHub has not made visible yet.
            let mut visible = Vec::new();
            m.pending_associations.retain_mut(|(s, pull, left)| {
                if s != sha {
                    true
                } else if *left == 0 {
                    visible.push((s.clone(), pull.clone()));
                    false
                } else {
                    *left -= 1;
                    true
                }
            });
            m.commit_pulls.extend(visible);
            let items: Vec<Value> = m
                .commit_pulls
                .iter()
                .filter(|(s, _)| s == sha)
                .map(|(_, p)| p.clone())
                .collect();
            paged(base, path, query, &items, page_size)
        }
        ("GET", ["repos", _, _, "pulls", n, "reviews"]) => {
            let n: u64 = n.parse().unwrap_or(0);
            let items: Vec<Value> = m
                .reviews
                .iter()
                .filter(|(p, _)| *p == n)
                .map(|(_, r)| r.clone())
                .collect();
            paged(base, path, query, &items, page_size)
        }
        ("GET", ["repos", _, _, "pulls"]) => {
            let head = query_param(query, "head").unwrap_or_default().to_string();
            let head = head
                .split_once(':')
                .map(|(_, b)| b.to_string())
                .unwrap_or(head);
            let base_branch = query_param(query, "base").map(str::to_string);
            let state = query_param(query, "state").unwrap_or("open").to_string();
            let items: Vec<Value> = m
                .pulls
                .iter()
                .filter(|p| p["head"]["ref"] == head.as_str())
                .filter(|p| base_branch.as_deref().is_none_or(|b| p["base"]["ref"] == b))
                .filter(|p| state == "all" || p["state"] == state.as_str())
                .cloned()
                .collect();
            paged(base, path, query, &items, page_size)
        }
        ("POST", ["repos", _, _, "pulls"]) => {
            let head = body["head"].as_str().unwrap_or_default().to_string();
            let base_branch = body["base"].as_str().unwrap_or_default().to_string();
            if m.pulls
                .iter()
                .any(|p| p["head"]["ref"] == head.as_str() && p["state"] == "open")
            {
                return json_response(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    &[],
                    &json!({"message": "Validation Failed", "errors": [{"resource": "PullRequest", "code": "custom", "message": format!("A pull request already exists for {OWNER}:{head}.")}], "documentation_url": "https://docs.github.com/rest/pulls/pulls#create-a-pull-request", "status": "422"}),
                );
            }
            let number = m.next_number;
            m.next_number += 1;
            let head_sha = m
                .head_of
                .as_ref()
                .and_then(|f| f(&head))
                .or_else(|| {
                    m.branch_heads
                        .iter()
                        .find(|(b, _)| *b == head)
                        .map(|(_, s)| s.clone())
                })
                .unwrap_or_else(|| "f".repeat(40));
            let mut pull = pull_json(
                number,
                &head,
                &base_branch,
                &head_sha,
                "open",
                None,
                &format!("{OWNER}/{REPO}"),
            );
            pull["body"] = body["body"].clone();
            pull["title"] = body["title"].clone();
            m.pulls.push(pull.clone());
            // GitHub starts computing mergeability against the base as it is now.
            let base_head = m.branch_head(&base_branch);
            let window = m.unknown_window;
            m.sim.insert(
                number,
                PullSim {
                    unknown_left: window,
                    base_at_push: base_head.clone(),
                    base_seen: base_head,
                    ..PullSim::default()
                },
            );
            json_response(StatusCode::CREATED, &[], &pull)
        }
        ("GET", ["repos", _, _, "pulls", n]) => {
            let n: u64 = n.parse().unwrap_or(0);
            let Some(index) = m.pulls.iter().position(|p| p["number"] == n) else {
                return not_found();
            };
            m.refresh(index, true);
            let mut pull = m.pulls[index].clone();
            let unknown = m.sim.get(&n).is_some_and(|s| s.unknown_left > 0);
            if pull["state"] == "open" {
                pull["mergeable"] = if unknown { Value::Null } else { json!(true) };
                pull["mergeable_state"] = json!(if unknown { "unknown" } else { "clean" });
            }
            json_response(StatusCode::OK, &[], &pull)
        }
        ("PATCH", ["repos", _, _, "pulls", n]) => {
            let n: u64 = n.parse().unwrap_or(0);
            match m.pulls.iter_mut().find(|p| p["number"] == n) {
                Some(p) => {
                    p["body"] = body["body"].clone();
                    p["title"] = body["title"].clone();
                    json_response(StatusCode::OK, &[], p)
                }
                None => not_found(),
            }
        }
        ("PUT", ["repos", _, _, "pulls", n, "merge"]) => {
            let n: u64 = n.parse().unwrap_or(0);
            let Some(index) = m.pulls.iter().position(|p| p["number"] == n) else {
                return not_found();
            };
            let refuse = |status: StatusCode, message: &str| {
                json_response(
                    status,
                    &[],
                    &json!({"message": message, "documentation_url": "https://docs.github.com/rest/pulls/pulls#merge-a-pull-request", "status": status.as_u16().to_string()}),
                )
            };
            if m.pulls[index]["state"] != "open" {
                return refuse(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "Pull Request is not mergeable",
                );
            }
            m.refresh(index, true);
            let pull = m.pulls[index].clone();
            if body["sha"]
                .as_str()
                .is_some_and(|s| Some(s) != pull["head"]["sha"].as_str())
            {
                return refuse(
                    StatusCode::CONFLICT,
                    "Head branch was modified. Review and try the merge again.",
                );
            }
            if let Some(sim) = m.sim.get_mut(&n)
                && sim.unknown_left > 0
            {
                sim.unknown_left -= 1;
                return refuse(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "Base branch was modified. Review and try the merge again.",
                );
            }
            if let Some(message) = m.protection_refusal(index, body) {
                return refuse(StatusCode::METHOD_NOT_ALLOWED, &message);
            }
            let merge = match &m.merge_hook {
                Some(hook) => match hook(n, &pull, body) {
                    Ok(sha) => sha,
                    Err((status, body)) => return json_response(status, &[], &body),
                },
                None => {
                    // Distinct merge commits; the first is `eee…` (older tests name it).
                    let tag = if m.merges_made == 0 {
                        String::new()
                    } else {
                        format!("{:x}", m.merges_made)
                    };
                    format!("{tag:e<40}")
                }
            };
            m.merges_made += 1;
            let p = &mut m.pulls[index];
            p["state"] = json!("closed");
            p["merged_at"] = json!("2026-12-01T00:00:00Z");
            p["merge_commit_sha"] = json!(merge.clone());
            let merged = p.clone();
            let base_ref = merged["base"]["ref"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            m.known_commits.push(merge.clone());
            if m.head_of.is_none() {
                // The base moves to the merge (with a repository, the hook moved it).
                m.branch_heads.push((base_ref, merge.clone()));
            }
            let lag = m.association_lag;
            if lag == 0 {
                m.commit_pulls.push((merge.clone(), merged));
            } else {
                m.pending_associations.push((merge.clone(), merged, lag));
            }
            json_response(
                StatusCode::OK,
                &[],
                &json!({"sha": merge, "merged": true, "message": "Pull Request successfully merged"}),
            )
        }
        ("GET", ["repos", _, _, "git", "ref", "heads", branch @ ..]) => {
            let branch = branch.join("/");
            match m.branch_head(&branch) {
                Some(sha) => json_response(
                    StatusCode::OK,
                    &[],
                    &json!({"ref": format!("refs/heads/{branch}"), "object": {"sha": sha, "type": "commit"}}),
                ),
                None => not_found(),
            }
        }
        ("GET", ["repos", _, _, "compare", range]) => {
            let Some((sha, branch)) = range.split_once("...") else {
                return not_found();
            };
            let holds = m.contains.iter().any(|(b, s)| b == branch && s == sha);
            json_response(
                StatusCode::OK,
                &[],
                &json!({"status": if holds { "ahead" } else { "diverged" }, "ahead_by": 1, "behind_by": 0}),
            )
        }
        ("POST", ["repos", _, _, "statuses", sha]) => {
            if !m.knows(sha) {
                return json_response(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    &[],
                    &json!({"message": format!("No commit found for SHA: {sha}"), "documentation_url": "https://docs.github.com/rest/commits/statuses#create-a-commit-status", "status": "422"}),
                );
            }
            m.statuses.push((sha.to_string(), body.clone()));
            json_response(
                StatusCode::CREATED,
                &[],
                &json!({"id": m.statuses.len(), "state": body["state"], "context": body["context"]}),
            )
        }
        ("GET", ["repos", _, _, "commits", sha, "status"]) => {
            let mut latest: Vec<Value> = Vec::new();
            for (_, status) in m.statuses.iter().filter(|(s, _)| s == sha) {
                latest.retain(|l| l["context"] != status["context"]);
                latest.push(json!({"context": status["context"], "state": status["state"], "description": status["description"]}));
            }
            let state = if latest
                .iter()
                .any(|s| s["state"] == "failure" || s["state"] == "error")
            {
                "failure"
            } else if latest.is_empty() || latest.iter().any(|s| s["state"] == "pending") {
                "pending"
            } else {
                "success"
            };
            json_response(
                StatusCode::OK,
                &[],
                &json!({"state": state, "sha": sha, "total_count": latest.len(), "statuses": latest}),
            )
        }
        ("GET", ["repos", _, _, "commits", sha, "check-runs"]) => {
            let runs: Vec<Value> = m
                .check_runs
                .iter()
                .filter(|(s, _)| s == sha)
                .map(|(_, r)| r.clone())
                .collect();
            json_response(
                StatusCode::OK,
                &[],
                &json!({"total_count": runs.len(), "check_runs": runs}),
            )
        }
        ("GET", ["repos", _, _, "issues"]) => {
            let label = query_param(query, "labels").unwrap_or_default().to_string();
            // GitHub's issues list holds pull requests too (marked by `pull_request`).
            let pulls_as_issues: Vec<Value> = m
                .pulls
                .iter()
                .map(|p| {
                    json!({"number": p["number"], "state": p["state"], "title": p["title"], "body": p["body"],
                        "labels": p.get("labels").cloned().unwrap_or(json!([])),
                        "pull_request": {"url": p["url"], "merged_at": p["merged_at"]}})
                })
                .collect();
            let items: Vec<Value> = m
                .issues
                .iter()
                .chain(pulls_as_issues.iter())
                .filter(|i| {
                    label.is_empty()
                        || i["labels"]
                            .as_array()
                            .is_some_and(|ls| ls.iter().any(|l| l["name"] == label.as_str()))
                })
                .cloned()
                .collect();
            paged(base, path, query, &items, page_size)
        }
        ("POST", ["repos", _, _, "issues"]) => {
            let number = m.next_number;
            m.next_number += 1;
            let labels: Vec<Value> = body["labels"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(|l| json!({"name": l}))
                .collect();
            let issue = json!({"number": number, "state": "open", "title": body["title"], "body": body["body"], "labels": labels});
            m.issues.push(issue.clone());
            json_response(StatusCode::CREATED, &[], &issue)
        }
        ("PATCH", ["repos", _, _, "issues", n]) => {
            let n: u64 = n.parse().unwrap_or(0);
            match m.issues.iter_mut().find(|i| i["number"] == n) {
                Some(i) => {
                    for key in ["title", "body", "state"] {
                        if !body[key].is_null() {
                            i[key] = body[key].clone();
                        }
                    }
                    json_response(StatusCode::OK, &[], i)
                }
                None => not_found(),
            }
        }
        _ => not_found(),
    }
}
