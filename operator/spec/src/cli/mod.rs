//! The `ears-manager` command line: dispatch over the command table (§14),
//! the JSON and human result protocol (§15), and the exit statuses (§16).
//! [`run`] is the whole program minus process I/O, so tests drive it
//! in-process (with fault injection) as well as through the binary.

pub mod args;
mod cmd_artifact;
mod cmd_change_set;
mod cmd_check;
mod cmd_project;
mod cmd_records;
pub mod session;

use std::{io::Read, path::Path};

use args::{Kind, Opts, Output};

use crate::{
    fsio::Faults,
    node::Node,
    outcome::{Exit, Failure},
};

/// What a successful command returns.
pub struct Success {
    /// Operation-specific data.
    pub data: Node,
    /// Files written, in write order (empty for reads).
    pub paths: Vec<String>,
}

impl Success {
    /// A read result.
    pub fn read(data: Node) -> Success {
        Success {
            data,
            paths: Vec::new(),
        }
    }
}

/// The result of one invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ran {
    /// Process exit status.
    pub status: i32,
    /// Bytes for stdout.
    pub stdout: String,
    /// Bytes for stderr.
    pub stderr: String,
}

/// Everything a command needs from the outside.
pub struct Env<'a> {
    /// Working directory.
    pub cwd: &'a Path,
    /// Standard input.
    pub stdin: &'a mut dyn Read,
    /// Fault injection (tests only; default none).
    pub faults: Faults,
}

type Handler = fn(&Opts, &mut Env<'_>) -> Result<Success, Failure>;

struct Command {
    name: &'static str,
    /// One line for `--help`.
    about: &'static str,
    spec: &'static [(&'static str, Kind)],
    /// Options the command cannot run without (all are reported at once).
    required: &'static [&'static str],
    run: Handler,
}

use Kind::{Flag, List, Value};

const COMMANDS: &[Command] = &[
    Command {
        name: "project init",
        about: "Register the Vision and Architecture and write .protobot/project.yaml and projection.yaml. Needs docs/vision.md and docs/architecture.md (or --vision/--architecture) committed at HEAD, and the default branch.",
        spec: &[
            ("id", Value),
            ("name", Value),
            ("canonical-remote", Value),
            ("review-mode", Value),
            ("default-branch", Value),
            ("branch-prefix", Value),
            ("vision", Value),
            ("architecture", Value),
        ],
        required: &["id", "name", "canonical-remote", "review-mode"],
        run: cmd_project::init,
    },
    Command {
        name: "artifact put",
        about: "Add or replace a governed artifact in a change set.",
        spec: &[
            ("change-set", Value),
            ("id", Value),
            ("kind", Value),
            ("path", Value),
            ("owner", Value),
            ("content-file", Value),
            ("content-stdin", Flag),
            ("validator", Value),
        ],
        required: &["change-set", "id", "kind", "path", "owner"],
        run: cmd_artifact::put,
    },
    Command {
        name: "artifact list",
        about: "List governed artifacts.",
        spec: &[("kind", Value), ("owner", Value)],
        required: &[],
        run: cmd_artifact::list,
    },
    Command {
        name: "artifact get",
        about: "Show one governed artifact (by --id or --kind).",
        spec: &[("at", Value), ("id", Value), ("kind", Value)],
        required: &[],
        run: cmd_artifact::get,
    },
    Command {
        name: "interface add",
        about: "Add an interface record to a change set (--created defaults to now).",
        spec: &[
            ("change-set", Value),
            ("id", Value),
            ("name", Value),
            ("type", Value),
            ("created", Value),
            ("spec-approach", Value),
            ("description", Value),
        ],
        required: &["change-set", "id", "name", "type"],
        run: cmd_records::interface_add,
    },
    Command {
        name: "interface list",
        about: "List interface records.",
        spec: &[("at", Value), ("type", Value), ("status", Value)],
        required: &[],
        run: cmd_records::interface_list,
    },
    Command {
        name: "interface update",
        about: "Update an interface record in a change set.",
        spec: &[
            ("change-set", Value),
            ("id", Value),
            ("name", Value),
            ("type", Value),
            ("spec-approach", Value),
            ("description", Value),
            ("status", Value),
            ("created", Value),
            ("new-id", Value),
        ],
        required: &["change-set", "id"],
        run: cmd_records::interface_update,
    },
    Command {
        name: "interface show",
        about: "Show one interface record.",
        spec: &[("at", Value), ("id", Value)],
        required: &["id"],
        run: cmd_records::interface_show,
    },
    Command {
        name: "requirement add",
        about: "Add an EARS requirement to a change set (--created defaults to now).",
        spec: &[
            ("change-set", Value),
            ("id", Value),
            ("type", Value),
            ("text", Value),
            ("verification-mode", Value),
            ("verification-rationale", Value),
            ("provenance", Value),
            ("created", Value),
            ("interface", List),
            ("scope", List),
            ("relationship", List),
        ],
        required: &[
            "change-set",
            "id",
            "type",
            "text",
            "verification-mode",
            "provenance",
        ],
        run: cmd_records::requirement_add,
    },
    Command {
        name: "requirement list",
        about: "List requirements.",
        spec: &[
            ("at", Value),
            ("interface", Value),
            ("scope", Value),
            ("type", Value),
            ("status", Value),
            ("relationship", Value),
        ],
        required: &[],
        run: cmd_records::requirement_list,
    },
    Command {
        name: "requirement show",
        about: "Show one requirement.",
        spec: &[("at", Value), ("id", Value)],
        required: &["id"],
        run: cmd_records::requirement_show,
    },
    Command {
        name: "requirement update",
        about: "Update a requirement in a change set.",
        spec: &[
            ("change-set", Value),
            ("id", Value),
            ("type", Value),
            ("text", Value),
            ("verification-mode", Value),
            ("verification-rationale", Value),
            ("provenance", Value),
            ("interface", List),
            ("scope", List),
            ("relationship", List),
            ("status", Value),
            ("created", Value),
            ("new-id", Value),
        ],
        required: &["change-set", "id"],
        run: cmd_records::requirement_update,
    },
    Command {
        name: "requirement retire",
        about: "Retire a requirement in a change set.",
        spec: &[("change-set", Value), ("id", Value)],
        required: &["change-set", "id"],
        run: cmd_records::requirement_retire,
    },
    Command {
        name: "change-set create",
        about: "Create a change set and check out its branch (--created defaults to now).",
        spec: &[
            ("intent", Value),
            ("implementation-required", Value),
            ("implementation-rationale", Value),
            ("created", Value),
            ("affected-interface", List),
            ("affected-scope", List),
        ],
        required: &["intent", "implementation-required"],
        run: cmd_change_set::create,
    },
    Command {
        name: "change-set list",
        about: "List change sets.",
        spec: &[
            ("status", Value),
            ("interface", Value),
            ("scope", Value),
            ("at", Value),
        ],
        required: &[],
        run: cmd_change_set::list,
    },
    Command {
        name: "change-set show",
        about: "Show one change set.",
        spec: &[("change-set", Value), ("at", Value)],
        required: &["change-set"],
        run: cmd_change_set::show,
    },
    Command {
        name: "change-set update",
        about: "Update a change set.",
        spec: &[
            ("change-set", Value),
            ("intent", Value),
            ("affected-interface", List),
            ("affected-scope", List),
            ("base-commit", Value),
            ("implementation-required", Value),
            ("implementation-rationale", Value),
            ("impact-file", Value),
        ],
        required: &["change-set"],
        run: cmd_change_set::update,
    },
    Command {
        name: "change-set compare",
        about: "Compare a change set against a commit.",
        spec: &[("change-set", Value), ("against", Value)],
        required: &["change-set"],
        run: cmd_change_set::compare,
    },
    Command {
        name: "check",
        about: "Validate the spec store (optionally one change set).",
        spec: &[("change-set", Value), ("at", Value)],
        required: &[],
        run: cmd_check::check,
    },
    Command {
        name: "impact",
        about: "Impact analysis of a change set.",
        spec: &[("change-set", Value), ("at", Value)],
        required: &["change-set"],
        run: cmd_check::impact,
    },
];

/// Version string for `--version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

fn usage_text() -> String {
    let mut s = String::from(
        "usage: ears-manager [--output human|json] <command> [<subcommand>] [options]\n\ncommands:\n",
    );
    for c in COMMANDS {
        s.push_str("  ");
        s.push_str(c.name);
        s.push('\n');
    }
    s
}

/// `ears-manager <command> --help`: what the command does and every option,
/// the required ones marked.
fn command_help(cmd: &Command) -> String {
    let mut s = format!(
        "usage: ears-manager [--output human|json] {} [options]\n\n{}\n\noptions:\n",
        cmd.name, cmd.about
    );
    for (name, kind) in cmd.spec {
        let shape = match kind {
            Kind::Flag => format!("--{name}"),
            Kind::Value => format!("--{name} VALUE"),
            Kind::List => format!("--{name} VALUE (repeatable)"),
        };
        let note = if cmd.required.contains(name) {
            "  required"
        } else if *name == "created" {
            "  default: now (RFC 3339, UTC)"
        } else {
            ""
        };
        s.push_str(format!("  {shape:<40}{note}").trim_end());
        s.push('\n');
        if let Some(values) = allowed_values(cmd.name, name) {
            s.push_str(&format!("      one of: {values}\n"));
        }
    }
    s.push_str("  --output human|json\n  --help\n");
    s
}

/// The values an option accepts, as the validator checks them (`None`: free
/// text, an ID or a path).
fn allowed_values(command: &str, option: &str) -> Option<String> {
    let list = |values: &[&str]| Some(values.join(", "));
    match (command.split(' ').next().unwrap_or_default(), option) {
        ("requirement", "type") => list(&crate::ears::TYPES),
        ("interface", "type") => list(&crate::model::INTERFACE_TYPES),
        (_, "verification-mode") => list(&["isolated-interface", "implementation-aware"]),
        (_, "provenance") => list(&["user-authored", "agent-suggested", "kit-imported"]),
        ("requirement" | "interface", "status") => list(&["active", "retired"]),
        (_, "review-mode") => list(&["single-player", "multi-player"]),
        (_, "implementation-required") => list(&["true", "false"]),
        (_, "relationship") => Some(format!(
            "TYPE=REQ-ID with TYPE {}",
            crate::model::RELATIONSHIP_TYPES.join(", ")
        )),
        (_, "impact-file") => Some(
            "a JSON array of {requirement_id, disposition (applicable|not-applicable), rationale, origin (mechanical|semantic)}, or the output of `ears-manager --output json impact` with a disposition and rationale filled in for each candidate; `-` reads stdin".into(),
        ),
        _ => None,
    }
}

/// `ears-manager <group> --help` (`requirement --help`): the group's commands.
fn group_help(group: &str) -> Option<String> {
    let members: Vec<&Command> = COMMANDS
        .iter()
        .filter(|c| c.name.split(' ').next() == Some(group) && c.name.contains(' '))
        .collect();
    if members.is_empty() {
        return None;
    }
    let mut s = format!(
        "usage: ears-manager [--output human|json] {group} <command> [options]\n\ncommands:\n"
    );
    for c in members {
        s.push_str(&format!("  {:<24}{}\n", c.name, c.about));
    }
    s.push_str(&format!(
        "\n'ears-manager {group} <command> --help' lists a command's options.\n"
    ));
    Some(s)
}

/// Reports every missing required option at once when more than one is
/// missing (a single one is reported by the command, as before).
fn missing_required(cmd: &Command, opts: &Opts) -> Result<(), Failure> {
    let missing: Vec<String> = cmd
        .required
        .iter()
        .filter(|n| !opts.has(n))
        .map(|n| format!("--{n}"))
        .collect();
    if missing.len() < 2 {
        return Ok(());
    }
    Err(Failure::usage(format!(
        "Options {} are required; 'ears-manager {} --help' lists every option.",
        missing.join(", "),
        cmd.name
    )))
}

/// Runs one invocation.
pub fn run(args: &[String], env: &mut Env<'_>) -> Ran {
    let g = args::split_global(args);
    let words: Vec<&str> = g
        .rest
        .iter()
        .take_while(|a| !a.starts_with("--"))
        .map(String::as_str)
        .take(2)
        .collect();
    let found = COMMANDS.iter().find(|c| {
        let n: Vec<&str> = c.name.split(' ').collect();
        words.len() >= n.len() && words[..n.len()] == n[..]
    });
    let command_name = match found {
        Some(c) => c.name.to_owned(),
        None => words.join(" "),
    };
    if g.bad_output {
        return render(
            Output::Human,
            &command_name,
            Err(Failure::usage("--output takes human or json.")),
        );
    }
    if g.version {
        if g.output == Output::Human {
            return Ran {
                status: 0,
                stdout: format!("ears-manager {VERSION}\n"),
                stderr: String::new(),
            };
        }
        return render(
            g.output,
            "version",
            Ok(Success::read(Node::map().with("version", Node::s(VERSION)))),
        );
    }
    if g.help {
        let text = match found {
            Some(cmd) => command_help(cmd),
            None => words
                .first()
                .and_then(|group| group_help(group))
                .unwrap_or_else(usage_text),
        };
        if g.output == Output::Human {
            return Ran {
                status: 0,
                stdout: text,
                stderr: String::new(),
            };
        }
        return render(
            g.output,
            "help",
            Ok(Success::read(Node::map().with("text", Node::s(text)))),
        );
    }
    let Some(cmd) = found else {
        return render(
            g.output,
            &command_name,
            Err(Failure::usage(
                "Unknown command; run 'ears-manager --help' for the list.",
            )),
        );
    };
    let n = cmd.name.split(' ').count();
    let result = args::parse(&g.rest[n..], cmd.spec).and_then(|opts| {
        missing_required(cmd, &opts)?;
        (cmd.run)(&opts, env)
    });
    render(g.output, cmd.name, result)
}

fn diag_node(d: &crate::diag::Diagnostic) -> Node {
    let mut n = Node::map()
        .with("code", Node::s(&d.code))
        .with("severity", Node::s("error"));
    for (k, v) in [
        ("path", &d.path),
        ("record_id", &d.record_id),
        ("field", &d.field),
    ] {
        if let Some(v) = v {
            n = n.with(k, Node::s(v));
        }
    }
    n = n.with("message", Node::s(&d.message));
    if let Some(h) = &d.hint {
        n = n.with("hint", Node::s(h));
    }
    n
}

fn to_json(n: &Node) -> String {
    serde_json::to_string(n).unwrap_or_else(|_| "null".to_owned())
}

fn render(output: Output, command: &str, result: Result<Success, Failure>) -> Ran {
    match (output, result) {
        (Output::Json, Ok(s)) => {
            let applied = !s.paths.is_empty();
            let env = Node::map()
                .with("schema_version", Node::Int(1))
                .with("ok", Node::Bool(true))
                .with("command", Node::s(command))
                .with("data", s.data)
                .with("diagnostics", Node::List(vec![]))
                .with(
                    "mutation",
                    Node::map()
                        .with("applied", Node::Bool(applied))
                        .with("paths", Node::strs(s.paths)),
                );
            Ran {
                status: 0,
                stdout: format!("{}\n", to_json(&env)),
                stderr: String::new(),
            }
        }
        (Output::Json, Err(f)) => {
            let env = Node::map()
                .with("schema_version", Node::Int(1))
                .with("ok", Node::Bool(false))
                .with("command", Node::s(command))
                .with(
                    "error",
                    Node::map()
                        .with("code", Node::s(&f.code))
                        .with("message", Node::s(&f.message))
                        .with("exit_code", Node::Int(i64::from(f.exit.code())))
                        .with(
                            "diagnostics",
                            Node::List(f.diagnostics.iter().map(diag_node).collect()),
                        )
                        .with("mutation", Node::s(f.mutation.as_str()))
                        .with("retry", Node::s(f.exit.retry())),
                );
            Ran {
                status: f.exit.code(),
                stdout: format!("{}\n", to_json(&env)),
                stderr: String::new(),
            }
        }
        (Output::Human, Ok(s)) => {
            let body = serde_json::to_string_pretty(&s.data).unwrap_or_default();
            Ran {
                status: 0,
                stdout: format!("{command}: ok\n{body}\n"),
                stderr: String::new(),
            }
        }
        (Output::Human, Err(f)) => {
            let mut e = format!("error[{}]: {}\n", f.code, f.message);
            for d in &f.diagnostics {
                let at = match (&d.path, &d.field) {
                    (Some(p), Some(fl)) => format!("{p}:{fl}"),
                    (Some(p), None) => p.clone(),
                    (None, Some(fl)) => fl.clone(),
                    (None, None) => String::from("-"),
                };
                e.push_str(&format!("at {at}: [{}] {}\n", d.code, d.message));
                if let Some(h) = &d.hint {
                    e.push_str(&format!("hint: {h}\n"));
                }
            }
            e.push_str(&format!(
                "mutation: {}\nretry: {}\n",
                f.mutation.as_str(),
                f.exit.retry()
            ));
            Ran {
                status: f.exit.code(),
                stdout: String::new(),
                stderr: e,
            }
        }
    }
}

/// Internal failure helper (status 70).
pub fn internal(message: &str) -> Failure {
    Failure::new(Exit::Internal, "internal.failure", message)
}

/// The usage envelope (status 2) for a command line whose argument `index` (0-based, after
/// the program name) is not valid UTF-8; `args` holds the arguments decoded lossily, so the
/// output mode and command name are still found.
pub fn non_utf8_argument(args: &[String], index: usize) -> Ran {
    render_failure(
        args,
        Failure::usage(format!(
            "Argument {} is not valid UTF-8; pass every argument as UTF-8 text.",
            index + 1
        )),
    )
}

/// `failure` rendered in the output mode `args` ask for, under the command name they give
/// (its first two words), for failures found before a command ran.
fn render_failure(args: &[String], failure: Failure) -> Ran {
    let g = args::split_global(args);
    let words: Vec<&str> = g
        .rest
        .iter()
        .take_while(|a| !a.starts_with("--"))
        .map(String::as_str)
        .take(2)
        .collect();
    let output = if g.bad_output {
        Output::Human
    } else {
        g.output
    };
    render(output, &words.join(" "), Err(failure))
}

/// The result to print when [`run`] itself failed unexpectedly (a panic):
/// `internal.failure`, status 70, in the output mode the caller asked for.
pub fn internal_failure(args: &[String]) -> Ran {
    render_failure(
        args,
        internal("ears-manager hit an internal error; keep this output and report it. Nothing is known to have changed.").unknown(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_groups_help_lists_its_commands_and_a_commands_help_its_allowed_values() {
        let cwd = std::env::temp_dir();
        let mut stdin = std::io::empty();
        let mut env = Env {
            cwd: &cwd,
            stdin: &mut stdin,
            faults: Default::default(),
        };
        let help = |args: &[&str], env: &mut Env<'_>| {
            let argv: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            run(&argv, env).stdout
        };
        let group = help(&["requirement", "--help"], &mut env);
        assert!(
            group.contains("requirement add") && group.contains("requirement retire"),
            "{group}"
        );
        assert!(!group.contains("change-set create"), "{group}");
        let add = help(&["requirement", "add", "--help"], &mut env);
        assert!(add.contains("one of: ubiquitous, event-driven"), "{add}");
        assert!(
            add.contains("one of: isolated-interface, implementation-aware"),
            "{add}"
        );
        assert!(
            add.contains("TYPE=REQ-ID with TYPE conflicts-with, depends-on"),
            "{add}"
        );
        let update = help(&["change-set", "update", "--help"], &mut env);
        assert!(
            update.contains("ears-manager --output json impact"),
            "{update}"
        );
        let top = help(&["nosuch", "--help"], &mut env);
        assert!(top.starts_with("usage: ears-manager"), "{top}");
    }

    #[test]
    fn human_help_and_version_are_plain_text() {
        let mut stdin: &[u8] = b"";
        let cwd = std::path::Path::new("/nonexistent");
        let mut env = Env {
            cwd,
            stdin: &mut stdin,
            faults: Faults::default(),
        };
        let help = run(&["--help".to_owned()], &mut env);
        assert_eq!(help.status, 0);
        assert!(
            help.stdout.starts_with("usage: ears-manager") && help.stdout.contains("  impact\n")
        );
        let version = run(&["--version".to_owned()], &mut env);
        assert_eq!(version.stdout, format!("ears-manager {VERSION}\n"));
    }

    #[test]
    fn internal_failures_exit_70_with_the_retain_token() {
        let args: Vec<String> = ["--output", "json", "check"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let ran = internal_failure(&args);
        assert_eq!(ran.status, 70);
        assert!(ran.stderr.is_empty());
        let v: serde_json::Value = serde_json::from_str(&ran.stdout).unwrap();
        assert_eq!(v["command"], "check");
        assert_eq!(v["error"]["code"], "internal.failure");
        assert_eq!(v["error"]["exit_code"], 70);
        assert_eq!(v["error"]["retry"], "retain-diagnostic");
        assert_eq!(v["error"]["mutation"], "unknown");
        let human = internal_failure(&["check".to_owned()]);
        assert!(human.stdout.is_empty() && human.stderr.starts_with("error[internal.failure]"));
    }
}
