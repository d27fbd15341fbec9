//! Pagination: GitHub's `Link: <url>; rel="next"` header, followed only on the API's origin.
//!
//! A `next` link on another host would send the token there, so it is refused, not followed.

use super::coordinates::ApiBase;

/// Why a `Link` header could not be followed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PageError {
    /// The next page is on another origin than the API base.
    #[error(
        "refused to follow a pagination link to `{link}`: it leaves the API base {origin} (check spec.forge.github.apiBaseUrl)"
    )]
    OffOrigin {
        /// The link.
        link: String,
        /// The API base URL.
        origin: String,
    },
}

/// The path and query of the `rel="next"` page relative to the API base, if the header
/// names one.
pub fn next_page(link_header: Option<&str>, base: &ApiBase) -> Result<Option<String>, PageError> {
    let Some(header) = link_header else {
        return Ok(None);
    };
    for part in header.split(',') {
        let mut pieces = part.split(';');
        let Some(target) = pieces.next().map(str::trim) else {
            continue;
        };
        let is_next = pieces.any(|p| {
            let p = p.trim();
            p == "rel=\"next\"" || p == "rel=next"
        });
        if !is_next {
            continue;
        }
        let Some(url) = target.strip_prefix('<').and_then(|t| t.strip_suffix('>')) else {
            continue;
        };
        // Relative to the base (octocrab prefixes the base path again).
        return match url.strip_prefix(base.as_str()) {
            Some(rest) if rest.starts_with('/') => Ok(Some(rest.to_string())),
            _ => Err(PageError::OffOrigin {
                link: url.to_string(),
                origin: base.as_str().to_string(),
            }),
        };
    }
    Ok(None)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_next_link_is_found_among_others() {
        let base = ApiBase::parse("https://api.github.com").unwrap();
        let header = r#"<https://api.github.com/repositories/1/issues?page=1>; rel="prev", <https://api.github.com/repositories/1/issues?page=3>; rel="next", <https://api.github.com/repositories/1/issues?page=9>; rel="last""#;
        assert_eq!(
            next_page(Some(header), &base).unwrap().as_deref(),
            Some("/repositories/1/issues?page=3")
        );
        let last = r#"<https://api.github.com/x?page=1>; rel="first""#;
        assert_eq!(next_page(Some(last), &base).unwrap(), None);
        assert_eq!(next_page(None, &base).unwrap(), None);
    }

    #[test]
    fn a_next_link_to_another_host_is_refused() {
        let base = ApiBase::parse("https://ghe.example/api/v3").unwrap();
        let header = r#"<https://evil.example/api/v3/x?page=2>; rel="next""#;
        assert!(matches!(
            next_page(Some(header), &base),
            Err(PageError::OffOrigin { .. })
        ));
        // Prefix tricks: `https://ghe.example.evil` is another host.
        let header = r#"<https://ghe.example.evil/x>; rel="next""#;
        assert!(next_page(Some(header), &base).is_err());
        let ok = r#"<https://ghe.example/api/v3/x?page=2>; rel="next""#;
        assert_eq!(
            next_page(Some(ok), &base).unwrap().as_deref(),
            Some("/x?page=2")
        );
    }
}
