//! Project-relative path rules shared by classification, export and bundle validation.
//!
//! Pure functions only. A *canonical project path* (spec-store contract §7) is non-empty, has no
//! `\`, NUL or `:`, no leading `/`, and every `/`-separated component is non-empty and neither
//! `.` nor `..`. On top of that the Job Site refuses any component that a case-insensitive or
//! NTFS-style filesystem would resolve to `.git`, because writing such a path can reach the
//! repository's own control directory.

use std::fmt;

use serde::{Deserialize, Serialize};
use unicode_normalization::{IsNormalized, UnicodeNormalization, is_nfc_quick};

/// Why a path is not acceptable as a project path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PathProblem {
    /// The path is empty.
    Empty,
    /// The path starts with `/` (or a drive letter, which `:` already excludes).
    Absolute,
    /// A component is `..`.
    ParentComponent,
    /// A component is empty or `.`.
    EmptyOrDotComponent,
    /// The path has `\`, NUL, `:` or a control character (a newline, a tab, …).
    ForbiddenCharacter,
    /// A component resolves to `.git` on some filesystem (`.git`, `.GIT`, `.git.`, `git~1`).
    GitComponent,
    /// A component is longer than [`MAX_COMPONENT_BYTES`] or the path longer than
    /// [`MAX_PATH_BYTES`].
    TooLong,
}

impl fmt::Display for PathProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            PathProblem::Empty => "the path is empty",
            PathProblem::Absolute => "the path is absolute",
            PathProblem::ParentComponent => "the path has a `..` component",
            PathProblem::EmptyOrDotComponent => "the path has an empty or `.` component",
            PathProblem::ForbiddenCharacter => "the path has a `\\`, NUL, `:` or control character",
            PathProblem::GitComponent => "the path has a component that resolves to `.git`",
            PathProblem::TooLong => {
                "the path has a component over 255 bytes or is over 1024 bytes long"
            }
        };
        f.write_str(text)
    }
}

/// Checks `path` against the canonical project path rules; returns the first problem found.
pub fn check_project_path(path: &str) -> Result<(), PathProblem> {
    if path.is_empty() {
        return Err(PathProblem::Empty);
    }
    if path.starts_with('/') {
        return Err(PathProblem::Absolute);
    }
    if path.contains(['\\', '\0', ':']) || path.chars().any(char::is_control) {
        return Err(PathProblem::ForbiddenCharacter);
    }
    for component in path.split('/') {
        match component {
            ".." => return Err(PathProblem::ParentComponent),
            "" | "." => return Err(PathProblem::EmptyOrDotComponent),
            other if is_git_component(other) => return Err(PathProblem::GitComponent),
            _ => {}
        }
    }
    Ok(())
}

/// True when a single path component would name the `.git` directory on a case-insensitive
/// filesystem, on NTFS (trailing dots and spaces are dropped) or through the 8.3 short name,
/// or on HFS+ (which ignores some zero-width code points when comparing names).
pub fn is_git_component(component: &str) -> bool {
    names_the_same(component, ".git") || names_the_same(component, "git~1")
}

/// Code points HFS+ ignores when comparing names (the list git itself checks: zero-width
/// joiners and marks, bidirectional controls, deprecated format characters, the BOM).
fn is_hfs_ignorable(c: char) -> bool {
    matches!(
        c,
        '\u{200C}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{206A}'..='\u{206F}' | '\u{FEFF}'
    )
}

/// True when `component` resolves to the ASCII name `name` on some filesystem: HFS+
/// ignorable code points removed, trailing dots and spaces dropped (NTFS), ASCII case
/// ignored.
pub fn names_the_same(component: &str, name: &str) -> bool {
    let visible: String = component
        .chars()
        .filter(|c| !is_hfs_ignorable(*c))
        .collect();
    visible
        .trim_end_matches(['.', ' '])
        .eq_ignore_ascii_case(name)
}

/// Longest path component a bundle may write, in bytes (the `NAME_MAX` of common
/// filesystems: a longer name cannot be checked out, exported or resumed).
pub const MAX_COMPONENT_BYTES: usize = 255;
/// Longest project path a bundle may write, in bytes. Far below `PATH_MAX` (4096) so that the
/// path still fits below the scratch, export and checkout directories it is written into.
pub const MAX_PATH_BYTES: usize = 1024;

/// Checks the length limits of a project path: every component at most
/// [`MAX_COMPONENT_BYTES`], the whole path at most [`MAX_PATH_BYTES`].
pub fn check_path_length(path: &str) -> Result<(), PathProblem> {
    if path.len() > MAX_PATH_BYTES || path.split('/').any(|c| c.len() > MAX_COMPONENT_BYTES) {
        return Err(PathProblem::TooLong);
    }
    Ok(())
}

/// The one folded key under which two spellings name the same file on some checkout: per
/// component, HFS+ ignorable code points removed and NTFS trailing dots and spaces dropped;
/// then the whole path lower-cased and composed (NFC), as a case-insensitive,
/// normalization-insensitive filesystem compares names. `.git` and `.protobot` get the same
/// folding through [`names_the_same`].
pub fn fold_key(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for (i, component) in path.split('/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        let visible: String = component
            .chars()
            .filter(|c| !is_hfs_ignorable(*c))
            .collect();
        let trimmed = visible.trim_end_matches(['.', ' ']);
        // `...` or `. ` keeps one dot: never an empty component.
        out.push_str(if trimmed.is_empty() { "." } else { trimmed });
    }
    case_fold_key(&out)
}

/// True when `path` is `dir` itself or lies below it (`dir` given without a trailing `/`).
pub fn is_under(path: &str, dir: &str) -> bool {
    path == dir
        || (path.len() > dir.len() && path.starts_with(dir) && path.as_bytes()[dir.len()] == b'/')
}

/// The key used to detect paths that collide on a case-insensitive filesystem. Case-insensitive
/// filesystems that matter here (APFS, HFS+) are also normalization-insensitive, so the key is
/// taken over the canonical composition: `Café` (NFC) and `cafe\u{301}` (NFD) share it.
pub fn case_fold_key(path: &str) -> String {
    normalization_key(&normalization_key(path).to_lowercase())
}

/// The key used to detect paths that collide on a normalization-insensitive filesystem (APFS,
/// HFS+, which store or compare names decomposed): the canonical composition (NFC) of the path.
/// Two different paths with the same key are canonically equivalent Unicode, such as `café`
/// written precomposed (NFC) and decomposed (NFD).
pub fn normalization_key(path: &str) -> String {
    if is_nfc_quick(path.chars()) == IsNormalized::Yes {
        path.to_owned()
    } else {
        path.nfc().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalization_and_case_fold_keys_see_through_composition() {
        let nfc = "tests/caf\u{e9}.rs";
        let nfd = "tests/cafe\u{301}.rs";
        assert_ne!(nfc, nfd);
        assert_eq!(normalization_key(nfc), nfc);
        assert_eq!(normalization_key(nfd), nfc);
        assert_eq!(normalization_key("src/lib.rs"), "src/lib.rs");
        assert_ne!(
            normalization_key("tests/Caf\u{e9}.rs"),
            normalization_key(nfd)
        );
        assert_eq!(case_fold_key("tests/CAFE\u{301}.rs"), case_fold_key(nfc));
        assert_eq!(
            case_fold_key("tests/Valid.rs"),
            case_fold_key("tests/valid.rs")
        );
        // Compatibility forms are different names on every filesystem: not folded.
        assert_ne!(normalization_key("\u{fb01}.rs"), normalization_key("fi.rs"));
    }

    #[test]
    fn canonical_paths_pass_and_hostile_paths_name_their_problem() {
        assert_eq!(check_project_path("src/lib.rs"), Ok(()));
        assert_eq!(check_project_path(".protobot/projection.yaml"), Ok(()));
        assert_eq!(check_project_path(""), Err(PathProblem::Empty));
        assert_eq!(
            check_project_path("/etc/passwd"),
            Err(PathProblem::Absolute)
        );
        assert_eq!(
            check_project_path("tests/../src/a.rs"),
            Err(PathProblem::ParentComponent)
        );
        assert_eq!(
            check_project_path("a//b"),
            Err(PathProblem::EmptyOrDotComponent)
        );
        assert_eq!(
            check_project_path("a/./b"),
            Err(PathProblem::EmptyOrDotComponent)
        );
        assert_eq!(
            check_project_path("a\\b"),
            Err(PathProblem::ForbiddenCharacter)
        );
        assert_eq!(
            check_project_path("c:x"),
            Err(PathProblem::ForbiddenCharacter)
        );
        assert_eq!(
            check_project_path(".git/config"),
            Err(PathProblem::GitComponent)
        );
        assert_eq!(
            check_project_path("x/.GIT/hooks/pre-commit"),
            Err(PathProblem::GitComponent)
        );
        assert_eq!(
            check_project_path("x/.git. /hooks"),
            Err(PathProblem::GitComponent)
        );
        assert_eq!(
            check_project_path("GIT~1/config"),
            Err(PathProblem::GitComponent)
        );
        // HFS+ ignores zero-width and bidirectional code points when comparing names.
        for spelled in [
            ".g\u{200C}it/config",
            "\u{200D}.git/hooks/x",
            ".GI\u{FEFF}T/config",
            "x/.git\u{202E}/config",
            ".g\u{206F}it\u{200E}. /x",
        ] {
            assert_eq!(
                check_project_path(spelled),
                Err(PathProblem::GitComponent),
                "{spelled:?}"
            );
        }
        assert_eq!(check_project_path(".gitignore"), Ok(()));
        for spelled in [
            "a\nb",
            "a\rb",
            "tab\there",
            "bell\u{7}",
            "del\u{7f}",
            "c1\u{85}",
        ] {
            assert_eq!(
                check_project_path(spelled),
                Err(PathProblem::ForbiddenCharacter),
                "{spelled:?}"
            );
        }
        assert_eq!(
            check_project_path(".g\u{200B}it/x"),
            Ok(()),
            "U+200B is not ignored"
        );
    }

    #[test]
    fn fold_key_sees_through_case_normalization_ignorables_and_ntfs_trailers() {
        let key = fold_key("tests/fixtures/impl_helper.rs");
        for spelled in [
            "tests/fixtures/Impl_Helper.rs",
            "Tests/FIXTURES/impl_helper.rs",
            "tests/fixtures./impl_helper.rs. ",
            "tests/fixtures /impl_helper.rs",
            "tests/fi\u{200c}xtures/impl_helper\u{feff}.rs",
        ] {
            assert_eq!(fold_key(spelled), key, "{spelled:?}");
        }
        assert_eq!(
            fold_key("tests/caf\u{e9}.rs"),
            fold_key("tests/CAFE\u{301}.rs")
        );
        assert_ne!(fold_key("tests/a.rs"), fold_key("tests/b.rs"));
        assert_eq!(fold_key("a/.../b"), "a/./b");
    }

    #[test]
    fn length_limits_bound_components_and_paths() {
        assert_eq!(check_path_length(&"n".repeat(255)), Ok(()));
        assert_eq!(
            check_path_length(&"n".repeat(256)),
            Err(PathProblem::TooLong)
        );
        let deep = "d/".repeat(512);
        assert_eq!(check_path_length(&deep[..1023]), Ok(()));
        assert_eq!(
            check_path_length(&"d/".repeat(513)),
            Err(PathProblem::TooLong)
        );
    }

    #[test]
    fn is_under_respects_component_boundaries() {
        assert!(is_under("tests/a.rs", "tests"));
        assert!(is_under("tests", "tests"));
        assert!(!is_under("tests2/a.rs", "tests"));
    }
}
