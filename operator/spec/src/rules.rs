//! Syntax rules for project paths (§7), Git branch names (§5), canonical
//! remotes (§5) and change-set branch slugs (§24). Pure string functions.

/// Canonical project-relative path: non-empty, no `\`, NUL or `:`, no
/// leading `/`, every `/` component non-empty and not `.`/`..`.
pub fn is_canonical_path(p: &str) -> bool {
    !p.is_empty()
        && !p.contains(['\\', '\0', ':'])
        && !p.starts_with('/')
        && p.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

const RESERVED_DIRS: [&str; 7] = [
    ".agents",
    ".claude",
    ".codex",
    ".github",
    ".git",
    ".opencode",
    ".protobot",
];
const RESERVED_LAST: [&str; 3] = ["agents.md", "claude.md", "opencode.json"];

/// Whether a (canonical) path is reserved and so can never be an artifact.
pub fn is_reserved_artifact_path(p: &str) -> bool {
    let lower = p.to_ascii_lowercase();
    let parts: Vec<&str> = lower.split('/').collect();
    if parts.iter().any(|c| RESERVED_DIRS.contains(c)) {
        return true;
    }
    parts
        .last()
        .is_some_and(|last| RESERVED_LAST.contains(last))
}

/// Whether `p` lies inside (or is) directory `dir`.
pub fn is_inside(p: &str, dir: &str) -> bool {
    let p = p.to_ascii_lowercase();
    let dir = dir.trim_end_matches('/').to_ascii_lowercase();
    p == dir || p.starts_with(&format!("{dir}/"))
}

const RESERVED_PROTOBOT_FILES: [&str; 6] = [
    "attestations",
    "kits.lock",
    "policy.yaml",
    "project.yaml",
    "projection.yaml",
    "test-catalog.jsonl",
];

/// Whether `p` is acceptable as a store directory (§5 `stores.*`).
pub fn is_valid_store_path(p: &str) -> bool {
    if !is_canonical_path(p) {
        return false;
    }
    let lower = p.to_ascii_lowercase();
    let parts: Vec<&str> = lower.split('/').collect();
    if lower == ".protobot" {
        return false;
    }
    let (first, rest) = if parts[0] == ".protobot" {
        if RESERVED_PROTOBOT_FILES.contains(&parts[1]) {
            return false;
        }
        (1, &parts[1..])
    } else {
        (0, &parts[..])
    };
    let _ = first;
    !rest.iter().any(|c| RESERVED_DIRS.contains(c))
        && !parts.last().is_some_and(|l| RESERVED_LAST.contains(l))
}

/// Git branch-name rule of §5.
pub fn is_valid_branch_name(name: &str) -> bool {
    if name.is_empty() || name == "@" {
        return false;
    }
    if name.starts_with('/') || name.ends_with('/') {
        return false;
    }
    if name.contains("//") || name.contains("..") || name.contains("@{") {
        return false;
    }
    if name
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || "~^:?*[\\".contains(c))
    {
        return false;
    }
    name.split('/').all(|c| {
        !c.is_empty()
            && c != "."
            && c != ".."
            && !c.starts_with('.')
            && !c.ends_with('.')
            && !c.ends_with(".lock")
    })
}

/// Branch-prefix rule: ends in `/`, the part before is a valid ref name,
/// and it does not start with `wi/`.
pub fn is_valid_branch_prefix(prefix: &str) -> bool {
    match prefix.strip_suffix('/') {
        Some(stem) => is_valid_branch_name(stem) && !prefix.starts_with("wi/"),
        None => false,
    }
}

/// Outcome of checking a canonical remote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteCheck {
    /// Acceptable.
    Ok,
    /// Bad form (`project.invalid_configuration`).
    Invalid,
    /// Carries userinfo (`project.remote_credentials`).
    Credentials,
}

/// Checks `repository.canonical_remote` (§5 remote rules).
pub fn check_remote(remote: &str) -> RemoteCheck {
    if remote.is_empty() || remote.chars().any(|c| c.is_whitespace()) {
        return RemoteCheck::Invalid;
    }
    if let Some((scheme, rest)) = remote.split_once("://") {
        if scheme != "https" && scheme != "ssh" {
            return RemoteCheck::Invalid;
        }
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.contains('@') {
            return RemoteCheck::Credentials;
        }
        if remote.contains(['?', '#']) || path.is_empty() || path == "/" {
            return RemoteCheck::Invalid;
        }
        let host = authority.rsplit_once(':').map_or(authority, |(h, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                h
            } else {
                authority
            }
        });
        if host.is_empty() {
            return RemoteCheck::Invalid;
        }
        return RemoteCheck::Ok;
    }
    if let Some(rest) = remote.strip_prefix("git@") {
        if let Some((host, path)) = rest.split_once(':') {
            let host_ok = !host.is_empty() && !host.contains(['/', '\\', '@']);
            let path_ok = !path.is_empty() && !path.contains(['\0', '\r', '\n']);
            return if host_ok && path_ok {
                RemoteCheck::Ok
            } else {
                RemoteCheck::Invalid
            };
        }
        return RemoteCheck::Invalid;
    }
    if let Some((before, _)) = remote.split_once(':')
        && before.contains('@')
    {
        return RemoteCheck::Credentials;
    }
    RemoteCheck::Invalid
}

/// Removes userinfo from a remote URL (keeping the fixed `git@` of the SCP
/// form), for the approval rule's exact-text comparison (§18).
pub fn strip_userinfo(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://") {
        let end = rest.find('/').unwrap_or(rest.len());
        if let Some(at) = rest[..end].rfind('@') {
            return format!("{scheme}://{}", &rest[at + 1..]);
        }
    }
    url.to_owned()
}

/// Branch slug of §24.
pub fn slug(intent: &str) -> String {
    let mut out = String::new();
    for c in intent.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let mut s = out.trim_matches('-').to_owned();
    if s.len() > 40 {
        s = match s[..40].rfind('-') {
            Some(i) if i > 0 => s[..i].to_owned(),
            _ => s[..40].to_owned(),
        };
        s = s.trim_end_matches('-').to_owned();
    }
    if s.is_empty() {
        "change-set".to_owned()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert!(is_canonical_path("docs/vision.md"));
        for bad in ["", "/a", "a//b", "a/./b", "a/../b", "a\\b", "c:x"] {
            assert!(!is_canonical_path(bad), "{bad}");
        }
        assert!(is_reserved_artifact_path("docs/CLAUDE.md"));
        assert!(is_reserved_artifact_path(".GitHub/x.md"));
        assert!(!is_reserved_artifact_path("docs/claude.md.txt"));
        assert!(is_valid_store_path(".protobot/requirements"));
        assert!(!is_valid_store_path(".protobot"));
        assert!(!is_valid_store_path(".protobot/policy.yaml"));
    }

    #[test]
    fn branch_names() {
        assert!(is_valid_branch_name("main"));
        assert!(is_valid_branch_name("release/v1"));
        for bad in [
            "", "@", "main~1", "main@{1}", "a..b", "/a", "a/", "a.lock", ".a", "a b",
        ] {
            assert!(!is_valid_branch_name(bad), "{bad}");
        }
        assert!(is_valid_branch_prefix("cs/"));
        assert!(!is_valid_branch_prefix("cs"));
        assert!(!is_valid_branch_prefix("wi/"));
        assert!(!is_valid_branch_prefix("wi/cs/"));
    }

    #[test]
    fn remotes() {
        assert_eq!(
            check_remote("https://example.invalid/fixture.git"),
            RemoteCheck::Ok
        );
        assert_eq!(check_remote("ssh://host/x"), RemoteCheck::Ok);
        assert_eq!(check_remote("git@github.com:o/r.git"), RemoteCheck::Ok);
        assert_eq!(check_remote("https://u:p@host/x"), RemoteCheck::Credentials);
        assert_eq!(check_remote("ssh://git@host/x"), RemoteCheck::Credentials);
        assert_eq!(check_remote("deploy@host:repo"), RemoteCheck::Credentials);
        for bad in [
            "http://h/x",
            "file:///x",
            "/x",
            "https://h",
            "https://h/",
            "https://h/x?y",
            " https://h/x",
        ] {
            assert_eq!(check_remote(bad), RemoteCheck::Invalid, "{bad}");
        }
        assert_eq!(strip_userinfo("https://u:p@h/x"), "https://h/x");
        assert_eq!(strip_userinfo("git@h:x"), "git@h:x");
    }

    #[test]
    fn slugs() {
        assert_eq!(slug("Define the CLI contract"), "define-the-cli-contract");
        assert_eq!(slug("  !! "), "change-set");
        let long = slug("aaaa bbbb cccc dddd eeee ffff gggg hhhh iiii jjjj");
        assert!(long.len() <= 40 && !long.ends_with('-'), "{long}");
    }
}
