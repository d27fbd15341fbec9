//! Request forms: what the sandbox sent, read as protocol, destination and
//! path for the decision.
//!
//! - base-URL form `GET /<host>/<path…>` (what `*_BASE_URL=http://proxy:3128/<host>`
//!   produces): `https://<host>/<path…>`;
//! - absolute form `GET https://host/path` (a proxy request): its scheme is
//!   the protocol, so `http://…` and `dns://…` reach the steps that refuse them;
//! - `CONNECT host:port`: a tunnel the proxy could not see into; the decision
//!   refuses it as a TLS bypass.

use hyper::{Method, Uri};

/// The request target, split for the decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Lowercase protocol.
    pub protocol: String,
    /// The authority as sent (`host[:port]`).
    pub destination: String,
    /// The path, without query.
    pub path: String,
    /// The query string, forwarded as is.
    pub query: Option<String>,
}

/// Reads the target of a request; `Err` says why it is not any known form.
pub fn parse_target(method: &Method, uri: &Uri) -> Result<Target, &'static str> {
    if method == Method::CONNECT {
        let authority = uri
            .authority()
            .ok_or("CONNECT without a host:port target")?;
        return Ok(Target {
            protocol: "https".to_owned(),
            destination: authority.as_str().to_owned(),
            path: "/".to_owned(),
            query: None,
        });
    }
    if let Some(scheme) = uri.scheme_str() {
        let authority = uri
            .authority()
            .ok_or("an absolute-form target without a host")?;
        if authority.as_str().contains('@') {
            return Err("user information in the target is not allowed");
        }
        return Ok(Target {
            protocol: scheme.to_ascii_lowercase(),
            destination: authority.as_str().to_owned(),
            path: uri.path().to_owned(),
            query: uri.query().map(str::to_owned),
        });
    }
    let rest = uri
        .path()
        .strip_prefix('/')
        .ok_or("the target is neither /<host>/<path> nor an absolute URL")?;
    let (host, path) = match rest.split_once('/') {
        Some((host, path)) => (host, format!("/{path}")),
        None => (rest, "/".to_owned()),
    };
    if host.is_empty() {
        return Err("the target names no host: use /<host>/<path> or an absolute URL");
    }
    if host.contains('@') {
        return Err("user information in the target is not allowed");
    }
    Ok(Target {
        protocol: "https".to_owned(),
        destination: host.to_owned(),
        path,
        query: uri.query().map(str::to_owned),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(method: &str, target: &str) -> Result<Target, &'static str> {
        parse_target(&method.parse().unwrap(), &target.parse().unwrap())
    }

    fn t(protocol: &str, destination: &str, path: &str, query: Option<&str>) -> Target {
        Target {
            protocol: protocol.into(),
            destination: destination.into(),
            path: path.into(),
            query: query.map(Into::into),
        }
    }

    #[test]
    fn base_url_form_means_https_to_the_first_segment() {
        assert_eq!(
            parse("POST", "/api.example.invalid/v1/messages?beta=1"),
            Ok(t(
                "https",
                "api.example.invalid",
                "/v1/messages",
                Some("beta=1")
            ))
        );
        assert_eq!(
            parse("GET", "/api.example.invalid"),
            Ok(t("https", "api.example.invalid", "/", None))
        );
        assert_eq!(
            parse("GET", "/api.example.invalid:8443/x"),
            Ok(t("https", "api.example.invalid:8443", "/x", None))
        );
        assert!(parse("GET", "/").is_err());
        assert!(parse("GET", "//x").is_err());
        assert!(parse("GET", "/user@api.example.invalid/x").is_err());
    }

    #[test]
    fn absolute_form_keeps_its_scheme() {
        assert_eq!(
            parse("GET", "https://registry.example.invalid/v2/allowed"),
            Ok(t("https", "registry.example.invalid", "/v2/allowed", None))
        );
        assert_eq!(
            parse("GET", "http://registry.example.invalid/v2/allowed"),
            Ok(t("http", "registry.example.invalid", "/v2/allowed", None))
        );
        assert_eq!(parse("GET", "dns://x.invalid/").unwrap().protocol, "dns");
        assert!(parse("GET", "https://u:p@registry.example.invalid/").is_err());
    }

    #[test]
    fn connect_is_read_as_a_tunnel_to_its_authority() {
        assert_eq!(
            parse("CONNECT", "registry.example.invalid:443"),
            Ok(t("https", "registry.example.invalid:443", "/", None))
        );
    }
}
