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
    spec: &'static [(&'static str, Kind)],
    run: Handler,
}

use Kind::{Flag, List, Value};

const COMMANDS: &[Command] = &[
    Command {
        name: "project init",
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
        run: cmd_project::init,
    },
    Command {
        name: "artifact put",
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
        run: cmd_artifact::put,
    },
    Command {
        name: "artifact list",
        spec: &[("kind", Value), ("owner", Value)],
        run: cmd_artifact::list,
    },
    Command {
        name: "artifact get",
        spec: &[("at", Value), ("id", Value), ("kind", Value)],
        run: cmd_artifact::get,
    },
    Command {
        name: "interface add",
        spec: &[
            ("change-set", Value),
            ("id", Value),
            ("name", Value),
            ("type", Value),
            ("created", Value),
            ("spec-approach", Value),
            ("description", Value),
        ],
        run: cmd_records::interface_add,
    },
    Command {
        name: "interface list",
        spec: &[("at", Value), ("type", Value), ("status", Value)],
        run: cmd_records::interface_list,
    },
    Command {
        name: "interface update",
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
        run: cmd_records::interface_update,
    },
    Command {
        name: "interface show",
        spec: &[("at", Value), ("id", Value)],
        run: cmd_records::interface_show,
    },
    Command {
        name: "requirement add",
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
        run: cmd_records::requirement_add,
    },
    Command {
        name: "requirement list",
        spec: &[
            ("at", Value),
            ("interface", Value),
            ("scope", Value),
            ("type", Value),
            ("status", Value),
            ("relationship", Value),
        ],
        run: cmd_records::requirement_list,
    },
    Command {
        name: "requirement show",
        spec: &[("at", Value), ("id", Value)],
        run: cmd_records::requirement_show,
    },
    Command {
        name: "requirement update",
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
        run: cmd_records::requirement_update,
    },
    Command {
        name: "requirement retire",
        spec: &[("change-set", Value), ("id", Value)],
        run: cmd_records::requirement_retire,
    },
    Command {
        name: "change-set create",
        spec: &[
            ("intent", Value),
            ("implementation-required", Value),
            ("implementation-rationale", Value),
            ("created", Value),
            ("affected-interface", List),
            ("affected-scope", List),
        ],
        run: cmd_change_set::create,
    },
    Command {
        name: "change-set list",
        spec: &[
            ("status", Value),
            ("interface", Value),
            ("scope", Value),
            ("at", Value),
        ],
        run: cmd_change_set::list,
    },
    Command {
        name: "change-set show",
        spec: &[("change-set", Value), ("at", Value)],
        run: cmd_change_set::show,
    },
    Command {
        name: "change-set update",
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
        run: cmd_change_set::update,
    },
    Command {
        name: "change-set compare",
        spec: &[("change-set", Value), ("against", Value)],
        run: cmd_change_set::compare,
    },
    Command {
        name: "check",
        spec: &[("change-set", Value), ("at", Value)],
        run: cmd_check::check,
    },
    Command {
        name: "impact",
        spec: &[("change-set", Value), ("at", Value)],
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
        if g.output == Output::Human {
            return Ran {
                status: 0,
                stdout: usage_text(),
                stderr: String::new(),
            };
        }
        return render(
            g.output,
            "help",
            Ok(Success::read(
                Node::map().with("text", Node::s(usage_text())),
            )),
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
    let result = args::parse(&g.rest[n..], cmd.spec).and_then(|opts| (cmd.run)(&opts, env));
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

/// The result to print when [`run`] itself failed unexpectedly (a panic):
/// `internal.failure`, status 70, in the output mode the caller asked for.
pub fn internal_failure(args: &[String]) -> Ran {
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
    render(
        output,
        &words.join(" "),
        Err(internal("ears-manager hit an internal error; keep this output and report it. Nothing is known to have changed.").unknown()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
