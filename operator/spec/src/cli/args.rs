//! Go-compatible option parsing (§14): global flags pulled out of any
//! position, `--name value` / `--name=value`, a value starting with `--`
//! only through `=`, last scalar wins, list options accumulate, required
//! values trimmed.

use std::collections::BTreeMap;

use crate::outcome::Failure;

/// Output mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Summary on stdout, errors on stderr.
    Human,
    /// One JSON document on stdout.
    Json,
}

/// What kind of option a name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Takes one value; repeated → last wins.
    Value,
    /// Takes one value per occurrence; accumulates.
    List,
    /// Takes no value.
    Flag,
}

/// The global part of an invocation.
#[derive(Debug, Clone)]
pub struct Global {
    /// `--output`.
    pub output: Output,
    /// `--help` anywhere.
    pub help: bool,
    /// `--version` anywhere.
    pub version: bool,
    /// Set when `--output` had a bad value (reported in human form).
    pub bad_output: bool,
    /// Everything else, in order.
    pub rest: Vec<String>,
}

/// Pulls `--output`, `--help` and `--version` out of any position.
pub fn split_global(args: &[String]) -> Global {
    let mut g = Global {
        output: Output::Human,
        help: false,
        version: false,
        bad_output: false,
        rest: Vec::new(),
    };
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        let set_output = |v: &str, g: &mut Global| match v {
            "json" => g.output = Output::Json,
            "human" => g.output = Output::Human,
            _ => g.bad_output = true,
        };
        if a == "--output" {
            match args.get(i + 1) {
                Some(v) => set_output(v, &mut g),
                None => g.bad_output = true,
            }
            i += 2;
            continue;
        }
        if let Some(v) = a.strip_prefix("--output=") {
            set_output(v, &mut g);
        } else if a == "--help" {
            g.help = true;
        } else if a == "--version" {
            g.version = true;
        } else {
            g.rest.push(a.clone());
        }
        i += 1;
    }
    g
}

/// Parsed options of one command.
#[derive(Debug, Clone, Default)]
pub struct Opts {
    values: BTreeMap<String, Vec<String>>,
    flags: BTreeMap<String, bool>,
}

/// Parses options against a spec.
pub fn parse(args: &[String], spec: &[(&str, Kind)]) -> Result<Opts, Failure> {
    let mut opts = Opts::default();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if a == "--" || !a.starts_with("--") {
            return Err(Failure::usage(
                "Unexpected argument; every input is given as an --option.",
            ));
        }
        let (name, inline) = match a[2..].split_once('=') {
            Some((n, v)) => (n.to_owned(), Some(v.to_owned())),
            None => (a[2..].to_owned(), None),
        };
        let Some((_, kind)) = spec.iter().find(|(n, _)| *n == name) else {
            return Err(Failure::usage(format!(
                "Unknown option --{name} for this command."
            )));
        };
        match kind {
            Kind::Flag => {
                if inline.is_some() {
                    return Err(Failure::usage(format!("Option --{name} takes no value.")));
                }
                opts.flags.insert(name, true);
                i += 1;
            }
            Kind::Value | Kind::List => {
                let value = match inline {
                    Some(v) => {
                        i += 1;
                        v
                    }
                    None => match args.get(i + 1) {
                        Some(v) if !v.starts_with("--") => {
                            i += 2;
                            v.clone()
                        }
                        _ => {
                            return Err(Failure::usage(format!(
                                "Option --{name} needs a value; use --{name}=VALUE for values that start with --."
                            )));
                        }
                    },
                };
                if value.is_empty() {
                    return Err(Failure::usage(format!(
                        "Option --{name} needs a non-empty value."
                    )));
                }
                let slot = opts.values.entry(name).or_default();
                if *kind == Kind::Value {
                    slot.clear();
                }
                slot.push(value);
            }
        }
    }
    Ok(opts)
}

impl Opts {
    /// The last value of a scalar option.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values
            .get(name)
            .and_then(|v| v.last())
            .map(String::as_str)
    }

    /// A required scalar option, trimmed; blank counts as missing.
    pub fn required(&self, name: &str) -> Result<String, Failure> {
        match self.get(name).map(str::trim) {
            Some(v) if !v.is_empty() => Ok(v.to_owned()),
            _ => Err(Failure::usage(format!("Option --{name} is required."))),
        }
    }

    /// `--created`, or the current time when it is not given (RFC 3339,
    /// UTC, whole seconds: the form the records store).
    pub fn created_or_now(&self) -> Result<String, Failure> {
        match self.get("created").map(str::trim) {
            Some(v) if !v.is_empty() => Ok(v.to_owned()),
            Some(_) => Err(Failure::usage("Option --created needs a non-empty value.")),
            None => {
                let secs = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                Ok(rfc3339_utc(secs))
            }
        }
    }

    /// All values of a list option (empty when not given).
    pub fn list(&self, name: &str) -> Vec<String> {
        self.values.get(name).cloned().unwrap_or_default()
    }

    /// Whether a list or value option was given at all.
    pub fn has(&self, name: &str) -> bool {
        self.values.contains_key(name) || self.flags.contains_key(name)
    }

    /// Whether a flag was given.
    pub fn flag(&self, name: &str) -> bool {
        self.flags.get(name).copied().unwrap_or(false)
    }

    /// A `true|false` option.
    pub fn boolean(&self, name: &str) -> Result<Option<bool>, Failure> {
        match self.get(name) {
            None => Ok(None),
            Some("true") => Ok(Some(true)),
            Some("false") => Ok(Some(false)),
            Some(_) => Err(Failure::usage(format!(
                "Option --{name} takes true or false."
            ))),
        }
    }
}

/// `secs` since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ` (proleptic
/// Gregorian calendar; days-from-civil inverse, H. Hinnant's algorithm).
pub fn rfc3339_utc(secs: u64) -> String {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (h, m, s) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn global_flags_come_out_of_any_position() {
        let g = split_global(&v(&[
            "check",
            "--output",
            "json",
            "--change-set",
            "CS-00001",
        ]));
        assert_eq!(g.output, Output::Json);
        assert_eq!(g.rest, v(&["check", "--change-set", "CS-00001"]));
        assert!(split_global(&v(&["--output=xml", "check"])).bad_output);
        assert!(split_global(&v(&["x", "--help"])).help);
    }

    #[test]
    fn option_rules() {
        let spec = [
            ("id", Kind::Value),
            ("scope", Kind::List),
            ("content-stdin", Kind::Flag),
        ];
        let o = parse(
            &v(&[
                "--id",
                "a",
                "--id=b",
                "--scope",
                "x",
                "--scope=y",
                "--content-stdin",
            ]),
            &spec,
        )
        .unwrap();
        assert_eq!(o.get("id"), Some("b"));
        assert_eq!(o.list("scope"), v(&["x", "y"]));
        assert!(o.flag("content-stdin"));
        for bad in [
            &["pos"][..],
            &["--"],
            &["--nope", "x"],
            &["--id", "--scope"],
            &["--id="],
            &["--content-stdin=1"],
            &["--id"],
        ] {
            assert!(parse(&v(bad), &spec).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse(&v(&["--id=--x"]), &spec).unwrap().get("id"),
            Some("--x")
        );
    }

    #[test]
    fn rfc3339_utc_formats_known_instants() {
        assert_eq!(super::rfc3339_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(super::rfc3339_utc(1_790_640_000), "2026-09-29T00:00:00Z");
        assert_eq!(super::rfc3339_utc(1_790_643_723), "2026-09-29T01:02:03Z");
    }
}
