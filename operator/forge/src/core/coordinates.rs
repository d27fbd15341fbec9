//! Which GitHub repository and which API: typed, validated once, then trusted.
//!
//! The owner and name come from the forge settings or are derived from the Project's
//! `repoUrl` (`https://github.com/o/r.git`, `git@github.com:o/r.git`, `ssh://git@host/o/r`).
//! The API base URL is `https://api.github.com` or a GitHub Enterprise Server's
//! `https://host/api/v3`; plain `http://` is accepted only on loopback (tests, a local proxy).

use std::fmt;

/// Public GitHub's REST API.
pub const DEFAULT_API_BASE: &str = "https://api.github.com";

/// Why coordinates or a base URL were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoordinatesError {
    /// Owner or name is empty or has characters GitHub does not allow.
    #[error(
        "unable to use `{value}` as a GitHub {what}: use letters, digits, `-`, `_` and `.` only (set spec.forge.github.owner/repository)"
    )]
    InvalidName {
        /// `owner` or `repository`.
        what: &'static str,
        /// The refused value.
        value: String,
    },
    /// The repository URL does not name `owner/name`.
    #[error(
        "unable to derive the GitHub owner and repository from `{url}`: it has no `owner/name` path; set spec.forge.github.owner and spec.forge.github.repository"
    )]
    NotDerivable {
        /// The URL (credentials never reach here: the Project refuses them).
        url: String,
    },
    /// The API base URL is not `https://…` (or `http://` on loopback), or carries credentials,
    /// a query or a fragment.
    #[error(
        "unable to use `{url}` as the GitHub API base URL: use https://api.github.com or https://<host>/api/v3 (no credentials, query or fragment; http only on loopback)"
    )]
    InvalidApiBase {
        /// The refused value.
        url: String,
    },
}

/// `owner/name` of a GitHub repository.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RepoCoordinates {
    owner: String,
    name: String,
}

impl RepoCoordinates {
    /// Validated coordinates.
    pub fn new(owner: &str, name: &str) -> Result<RepoCoordinates, CoordinatesError> {
        let name = name.strip_suffix(".git").unwrap_or(name);
        check_name("owner", owner)?;
        check_name("repository", name)?;
        Ok(RepoCoordinates {
            owner: owner.to_string(),
            name: name.to_string(),
        })
    }

    /// Derives the coordinates from a clone URL (HTTPS, SSH or scp-like).
    pub fn from_repo_url(url: &str) -> Result<RepoCoordinates, CoordinatesError> {
        let not = || CoordinatesError::NotDerivable {
            url: url.to_string(),
        };
        let path = if let Some((_, rest)) = url.split_once("://") {
            rest.split_once('/').map(|(_, p)| p).ok_or_else(not)?
        } else if let Some((host, path)) = url.split_once(':') {
            // scp-like `git@github.com:o/r.git`
            if host.contains('/') {
                return Err(not());
            }
            path
        } else {
            return Err(not());
        };
        let mut parts = path.trim_matches('/').split('/');
        let (Some(owner), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(not());
        };
        RepoCoordinates::new(owner, name).map_err(|_| not())
    }

    /// The owner (user or organization).
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The repository name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/repos/{owner}/{name}`, the prefix of every repository route.
    pub fn route(&self) -> String {
        format!("/repos/{}/{}", self.owner, self.name)
    }
}

impl fmt::Display for RepoCoordinates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.owner, self.name)
    }
}

fn check_name(what: &'static str, value: &str) -> Result<(), CoordinatesError> {
    let ok = !value.is_empty()
        && value.len() <= 100
        && value != "."
        && value != ".."
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(CoordinatesError::InvalidName {
            what,
            value: value.to_string(),
        })
    }
}

/// A validated API base URL (no trailing slash).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiBase(String);

impl ApiBase {
    /// Validates `url`.
    pub fn parse(url: &str) -> Result<ApiBase, CoordinatesError> {
        let invalid = || CoordinatesError::InvalidApiBase {
            url: url.to_string(),
        };
        let trimmed = url.trim_end_matches('/');
        let (scheme, rest) = trimmed.split_once("://").ok_or_else(invalid)?;
        let authority = rest.split('/').next().unwrap_or_default();
        let host = host_of(authority);
        let loopback = matches!(host, "127.0.0.1" | "localhost" | "[::1]");
        let scheme_ok = scheme == "https" || (scheme == "http" && loopback);
        if !scheme_ok
            || authority.is_empty()
            || authority.contains('@')
            || rest.contains(['?', '#'])
            || rest.contains(char::is_whitespace)
        {
            return Err(invalid());
        }
        Ok(ApiBase(trimmed.to_string()))
    }

    /// The URL.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `scheme://authority` of the base: pagination links must stay on it.
    pub fn origin(&self) -> &str {
        let after_scheme = self.0.find("://").map_or(0, |i| i + 3);
        let end = self.0[after_scheme..]
            .find('/')
            .map_or(self.0.len(), |i| after_scheme + i);
        &self.0[..end]
    }

    /// The path prefix of the base (`""` for api.github.com, `/api/v3` for Enterprise).
    pub fn path_prefix(&self) -> &str {
        &self.0[self.origin().len()..]
    }
}

fn host_of(authority: &str) -> &str {
    if authority.starts_with('[') {
        return authority.find(']').map_or(authority, |i| &authority[..=i]);
    }
    authority.split(':').next().unwrap_or(authority)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn coordinates_are_derived_from_every_clone_url_form() {
        for url in [
            "https://github.com/acme/widgets.git",
            "https://github.com/acme/widgets",
            "git@github.com:acme/widgets.git",
            "ssh://git@github.com/acme/widgets.git",
            "https://ghe.example:8443/acme/widgets/",
        ] {
            let c = RepoCoordinates::from_repo_url(url).unwrap();
            assert_eq!((c.owner(), c.name()), ("acme", "widgets"), "{url}");
        }
        assert_eq!(
            RepoCoordinates::new("acme", "widgets").unwrap().route(),
            "/repos/acme/widgets"
        );
    }

    #[test]
    fn urls_without_owner_and_name_or_with_odd_names_are_refused() {
        for url in [
            "https://github.com/acme",
            "https://github.com/a/b/c",
            "/srv/repo.git",
            "https://github.com/ac me/x",
            "https://github.com/../x",
        ] {
            assert!(
                matches!(
                    RepoCoordinates::from_repo_url(url),
                    Err(CoordinatesError::NotDerivable { .. })
                ),
                "{url}"
            );
        }
        assert!(RepoCoordinates::new("a/b", "c").is_err());
    }

    #[test]
    fn api_base_is_https_or_loopback_http_without_credentials() {
        let ghe = ApiBase::parse("https://ghe.example/api/v3/").unwrap();
        assert_eq!(ghe.as_str(), "https://ghe.example/api/v3");
        assert_eq!(ghe.origin(), "https://ghe.example");
        assert_eq!(ghe.path_prefix(), "/api/v3");
        assert_eq!(ApiBase::parse(DEFAULT_API_BASE).unwrap().path_prefix(), "");
        assert!(ApiBase::parse("http://127.0.0.1:8080").is_ok());
        for bad in [
            "http://api.github.com",
            "https://user:tok@api.github.com",
            "https://api.github.com?x=1",
            "ftp://x",
            "api.github.com",
        ] {
            assert!(ApiBase::parse(bad).is_err(), "{bad}");
        }
    }
}
