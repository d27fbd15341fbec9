//! A fake GitHub REST API on loopback for the forge's tests: it serves the documented
//! responses (status codes, headers, `Link` pagination, rate-limit and error bodies) from a
//! small in-memory model, records every request, and lets a test script the next answers of a
//! route (a limit, a refusal, a lost answer). [`Fake::serve_repository`] backs its pull
//! requests with a real bare repository (heads follow the pushed branches, the merge endpoint
//! really merges there).
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
            json_response(StatusCode::CREATED, &[], &pull)
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
            let followed = m
                .head_of
                .as_ref()
                .and_then(|f| f(m.pulls[index]["head"]["ref"].as_str().unwrap_or_default()));
            if let Some(sha) = followed {
                m.pulls[index]["head"]["sha"] = json!(sha);
            }
            let pull = m.pulls[index].clone();
            if pull["state"] != "open" {
                return json_response(
                    StatusCode::METHOD_NOT_ALLOWED,
                    &[],
                    &json!({"message": "Pull Request is not mergeable", "documentation_url": "https://docs.github.com/rest/pulls/pulls#merge-a-pull-request", "status": "405"}),
                );
            }
            if body["sha"]
                .as_str()
                .is_some_and(|s| Some(s) != pull["head"]["sha"].as_str())
            {
                return json_response(
                    StatusCode::CONFLICT,
                    &[],
                    &json!({"message": "Head branch was modified. Review and try the merge again.", "documentation_url": "https://docs.github.com/rest/pulls/pulls#merge-a-pull-request", "status": "409"}),
                );
            }
            let merge = match &m.merge_hook {
                Some(hook) => match hook(n, &pull, body) {
                    Ok(sha) => sha,
                    Err((status, body)) => return json_response(status, &[], &body),
                },
                None => "e".repeat(40),
            };
            let p = &mut m.pulls[index];
            p["state"] = json!("closed");
            p["merged_at"] = json!("2026-12-01T00:00:00Z");
            p["merge_commit_sha"] = json!(merge.clone());
            json_response(
                StatusCode::OK,
                &[],
                &json!({"sha": merge, "merged": true, "message": "Pull Request successfully merged"}),
            )
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
            m.statuses.push((sha.to_string(), body.clone()));
            json_response(
                StatusCode::CREATED,
                &[],
                &json!({"id": m.statuses.len(), "state": body["state"], "context": body["context"]}),
            )
        }
        ("GET", ["repos", _, _, "issues"]) => {
            let label = query_param(query, "labels").unwrap_or_default().to_string();
            let items: Vec<Value> = m
                .issues
                .iter()
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
