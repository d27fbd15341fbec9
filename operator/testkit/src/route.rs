//! Request routing: turn a request path and query string into a [`Route`] and
//! [`Query`], the way the API server's path layout works (including the
//! `/api/v1/namespaces/<ns>` vs `/api/v1/namespaces/<ns>/<plural>` ambiguity).

use std::collections::BTreeMap;

/// What a path addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `GET /version`
    Version,
    /// `GET /api`
    CoreVersions,
    /// `GET /apis`
    GroupList,
    /// `GET /apis/<group>`
    Group(String),
    /// `GET /api/v1` or `GET /apis/<group>/<version>`
    ResourceList {
        /// API group (empty for core).
        group: String,
        /// Version.
        version: String,
    },
    /// A resource collection, object or subresource.
    Resource(Target),
}

/// A resource path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// API group (empty for core).
    pub group: String,
    /// Version.
    pub version: String,
    /// Plural resource name.
    pub plural: String,
    /// Namespace from the path, if any.
    pub namespace: Option<String>,
    /// Object name, if any.
    pub name: Option<String>,
    /// Subresource (`status`, `log`), if any.
    pub subresource: Option<String>,
}

fn target(group: &str, version: &str, rest: &[&str]) -> Option<Route> {
    let owned = |s: &&str| (*s).to_owned();
    let namespaced = rest.first() == Some(&"namespaces")
        && rest.len() >= 3
        && !(rest.len() == 3 && matches!(rest[2], "status" | "finalize"));
    let (namespace, rest) = if namespaced {
        (rest.get(1).map(owned), &rest[2..])
    } else {
        (None, rest)
    };
    if rest.is_empty() || rest.len() > 3 {
        return None;
    }
    Some(Route::Resource(Target {
        group: group.to_owned(),
        version: version.to_owned(),
        plural: rest[0].to_owned(),
        namespace,
        name: rest.get(1).map(owned),
        subresource: rest.get(2).map(owned),
    }))
}

/// Parse a request path.
pub fn parse_path(path: &str) -> Option<Route> {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    match segs.as_slice() {
        ["version"] => Some(Route::Version),
        ["api"] => Some(Route::CoreVersions),
        ["api", v] => Some(Route::ResourceList {
            group: String::new(),
            version: (*v).to_owned(),
        }),
        ["api", v, rest @ ..] => target("", v, rest),
        ["apis"] => Some(Route::GroupList),
        ["apis", g] => Some(Route::Group((*g).to_owned())),
        ["apis", g, v] => Some(Route::ResourceList {
            group: (*g).to_owned(),
            version: (*v).to_owned(),
        }),
        ["apis", g, v, rest @ ..] => target(g, v, rest),
        _ => None,
    }
}

/// Decoded query parameters (last value wins, as with Go's `Get`).
#[derive(Debug, Clone, Default)]
pub struct Query(BTreeMap<String, String>);

impl Query {
    /// Parse a raw query string.
    pub fn parse(raw: Option<&str>) -> Self {
        Self(
            form_urlencoded::parse(raw.unwrap_or("").as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    /// A parameter, if present and non-empty.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// A boolean parameter (`true`/`1`).
    pub fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_object_and_namespaced_collections_are_told_apart() {
        let Some(Route::Resource(t)) = parse_path("/api/v1/namespaces/team-a") else {
            panic!("not a resource")
        };
        assert_eq!(
            (t.plural.as_str(), t.name.as_deref(), t.namespace),
            ("namespaces", Some("team-a"), None)
        );
        let Some(Route::Resource(t)) = parse_path("/api/v1/namespaces/team-a/status") else {
            panic!("not a resource")
        };
        assert_eq!(
            (t.plural.as_str(), t.subresource.as_deref()),
            ("namespaces", Some("status"))
        );
        let Some(Route::Resource(t)) =
            parse_path("/apis/example.com/v1/namespaces/ns/widgets/w/status")
        else {
            panic!("not a resource")
        };
        assert_eq!(t.namespace.as_deref(), Some("ns"));
        assert_eq!(t.name.as_deref(), Some("w"));
        assert_eq!(t.subresource.as_deref(), Some("status"));
        assert_eq!(
            parse_path("/apis/example.com/v1"),
            Some(Route::ResourceList {
                group: "example.com".into(),
                version: "v1".into()
            })
        );
    }
}
