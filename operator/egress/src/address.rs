//! Destination authorities: split `host[:port]` and recognise every way of
//! writing an IP address or a loopback name.
//!
//! Resolvers accept far more than dotted quads: `127.1`, `2130706433`,
//! `0x7f000001` and `0177.0.0.1` all reach 127.0.0.1. A rule names DNS hosts
//! only, so any host whose dot-separated labels are all numbers (decimal,
//! `0x` hex or leading-zero octal) counts as a direct IP, as does anything
//! with a `:` left after the port is split off (bare IPv6) or in brackets.

/// A destination authority split into host and optional port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Authority {
    /// The host, lowercased, with one trailing dot removed; IPv6 literals keep
    /// their brackets.
    pub host: String,
    /// The port as written (`None`: none given; `Some(Err)`: not a number).
    pub port: Option<Result<u16, String>>,
}

/// Splits `authority` into host and port.
pub fn split_authority(authority: &str) -> Authority {
    let lower = authority.trim().to_ascii_lowercase();
    if let Some(rest) = lower.strip_prefix('[') {
        // Bracketed IPv6, with or without a port.
        return match rest.split_once(']') {
            Some((inner, tail)) => Authority {
                host: format!("[{inner}]"),
                port: tail.strip_prefix(':').map(parse_port),
            },
            None => Authority {
                host: lower.clone(),
                port: None,
            },
        };
    }
    if lower.matches(':').count() > 1 {
        // A bare IPv6 literal: no port can be told apart.
        return Authority {
            host: lower,
            port: None,
        };
    }
    let (host, port) = match lower.split_once(':') {
        Some((h, p)) => (h.to_owned(), Some(parse_port(p))),
        None => (lower, None),
    };
    let host = host.strip_suffix('.').map(str::to_owned).unwrap_or(host);
    Authority { host, port }
}

fn parse_port(p: &str) -> Result<u16, String> {
    p.parse::<u16>().map_err(|_| p.to_owned())
}

/// Whether `host` (as returned by [`split_authority`]) reaches an address
/// without a DNS name: loopback names, IP literals of every notation.
pub fn is_direct_ip(host: &str) -> bool {
    if host == "localhost" || host.ends_with(".localhost") {
        return true;
    }
    if host.starts_with('[') || host.contains(':') {
        return true;
    }
    is_numeric_host(host)
}

/// Whether every dot-separated label of `host` is a number in some base the
/// C resolver accepts (`127.1`, `0x7f.1`, `017700000001`, `2130706433`).
pub fn is_numeric_host(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    !host.is_empty() && host.split('.').all(is_numeric_label)
}

fn is_numeric_label(label: &str) -> bool {
    if label.is_empty() {
        return false;
    }
    let lower = label.to_ascii_lowercase();
    if let Some(hex) = lower.strip_prefix("0x") {
        // `0x` alone is accepted by inet_aton as zero.
        return hex.bytes().all(|b| b.is_ascii_hexdigit());
    }
    lower.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities_split_into_host_and_port() {
        assert_eq!(
            split_authority("Registry.Example.Invalid:8443"),
            Authority {
                host: "registry.example.invalid".into(),
                port: Some(Ok(8443))
            }
        );
        assert_eq!(
            split_authority("a.example."),
            Authority {
                host: "a.example".into(),
                port: None
            }
        );
        assert_eq!(
            split_authority("[::1]:443"),
            Authority {
                host: "[::1]".into(),
                port: Some(Ok(443))
            }
        );
        assert_eq!(split_authority("::1").host, "::1");
        assert_eq!(split_authority("::1").port, None);
        assert_eq!(
            split_authority("a.example:http").port,
            Some(Err("http".into()))
        );
        assert_eq!(
            split_authority("a.example:99999").port,
            Some(Err("99999".into()))
        );
    }

    #[test]
    fn every_ip_notation_is_direct() {
        for host in [
            "localhost",
            "api.localhost",
            "127.0.0.1",
            "127.1",
            "10.1",
            "2130706433",
            "0x7f000001",
            "0x7f.0.0.1",
            "0177.0.0.1",
            "::1",
            "[::1]",
            "[fe80::1%25eth0]",
            "::ffff:127.0.0.1",
        ] {
            let a = split_authority(host);
            assert!(is_direct_ip(&a.host), "{host} should be a direct IP");
        }
    }

    #[test]
    fn dns_names_are_not_direct_even_with_digits() {
        for host in [
            "registry.example.invalid",
            "1password.com",
            "0x.example",
            "api.example.com",
            "123.example",
            "example.123a",
        ] {
            assert!(!is_direct_ip(&split_authority(host).host), "{host}");
        }
    }
}
