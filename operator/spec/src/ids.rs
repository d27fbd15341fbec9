//! Identifier and timestamp syntax (contract §3, §8): requirement, interface,
//! artifact and change-set IDs, record filenames, commit IDs and `created`.

/// `^REQ-[A-Z][A-Z0-9-]*-[0-9]{5}$`
pub fn is_requirement_id(s: &str) -> bool {
    let Some(rest) = s.strip_prefix("REQ-") else {
        return false;
    };
    let b = rest.as_bytes();
    if b.len() < 7 || !b[0].is_ascii_uppercase() {
        return false;
    }
    let (scope, tail) = b.split_at(b.len() - 6);
    tail[0] == b'-'
        && tail[1..].iter().all(u8::is_ascii_digit)
        && scope
            .iter()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == b'-')
}

/// `^[a-z0-9]+(?:-[a-z0-9]+)*$` (interfaces and artifacts).
pub fn is_kebab_id(s: &str) -> bool {
    !s.is_empty()
        && s.split('-').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        })
}

/// `^CS-[0-9]{5}$`
pub fn is_change_set_id(s: &str) -> bool {
    s.strip_prefix("CS-")
        .is_some_and(|d| d.len() == 5 && d.bytes().all(|c| c.is_ascii_digit()))
}

/// Number of a valid change-set ID.
pub fn change_set_number(id: &str) -> Option<u32> {
    if is_change_set_id(id) {
        id[3..].parse().ok()
    } else {
        None
    }
}

/// Manifest file name for a change-set ID: `cs-<nnnnn>.yaml`.
pub fn change_set_file_name(id: &str) -> String {
    format!("cs-{}.yaml", id.get(3..).unwrap_or(""))
}

/// Change-set ID for a number.
pub fn change_set_id(n: u32) -> String {
    format!("CS-{n:05}")
}

/// `^[0-9a-fA-F]{40}$`
pub fn is_full_sha(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|c| c.is_ascii_hexdigit())
}

/// `YYYY-MM-DDTHH:MM:SSZ` that is also a real calendar time.
pub fn is_timestamp(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() != 20 {
        return false;
    }
    let shape = b"dddd-dd-ddTdd:dd:ddZ";
    if !b.iter().zip(shape.iter()).all(|(c, p)| {
        if *p == b'd' {
            c.is_ascii_digit()
        } else {
            c == p
        }
    }) {
        return false;
    }
    let num = |r: std::ops::Range<usize>| -> u32 {
        b[r].iter().fold(0, |acc, c| acc * 10 + u32::from(c - b'0'))
    };
    let (year, month, day) = (num(0..4), num(5..7), num(8..10));
    let (hour, minute, second) = (num(11..13), num(14..16), num(17..19));
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&day) && hour < 24 && minute < 60 && second < 60
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requirement_ids_follow_the_five_digit_form() {
        assert!(is_requirement_id("REQ-CLI-00001"));
        assert!(is_requirement_id("REQ-CLI-ADMIN-00001"));
        assert!(is_requirement_id("REQ-A1-00001"));
        assert!(!is_requirement_id("REQ-CLI-001"));
        assert!(!is_requirement_id("REQ-cli-00001"));
        assert!(!is_requirement_id("REQ-1A-00001"));
        assert!(!is_requirement_id("REQ--00001"));
    }

    #[test]
    fn kebab_and_change_set_ids() {
        assert!(is_kebab_id("cli-main"));
        assert!(!is_kebab_id("cli--main"));
        assert!(!is_kebab_id("-cli"));
        assert!(!is_kebab_id("Cli"));
        assert!(is_change_set_id("CS-00001"));
        assert!(!is_change_set_id("CS-001"));
        assert_eq!(change_set_file_name("CS-00042"), "cs-00042.yaml");
    }

    #[test]
    fn timestamps_must_be_real_calendar_times() {
        assert!(is_timestamp("2026-09-15T12:03:00Z"));
        assert!(is_timestamp("2024-02-29T23:59:59Z"));
        assert!(!is_timestamp("2026-02-29T00:00:00Z"));
        assert!(!is_timestamp("2026-02-30T00:00:00Z"));
        assert!(!is_timestamp("2026-09-15T24:00:00Z"));
        assert!(!is_timestamp("2026-09-15T23:59:60Z"));
        assert!(!is_timestamp("2026-09-15 12:03:00Z"));
        assert!(!is_timestamp("2026-09-15T12:03:00+00:00"));
    }
}
