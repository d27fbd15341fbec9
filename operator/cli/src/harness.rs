//! A worker harness directory as `protobot run` uses it: how each script is
//! started in the sandbox, and what else the sandbox holds for it.
//!
//! - A script that starts with `#!` runs under that interpreter, as the kernel
//!   would start it (`#!/bin/bash` gets bash, `set -o pipefail` works); one
//!   without runs under `sh`. Either way it runs by its path in a read-only
//!   copy of the harness directory ([`stage`]) mounted in the sandbox, so a
//!   script can call a helper beside it (`"$(dirname "$0")/helper"`).
//! - `<harness>/sandbox` (optional) lists what the sandbox needs beyond the
//!   system `/usr`: `path /abs/dir` lines (host directories mounted read-only
//!   at the same place: a venv, `~/.nvm/versions/node/v22`, `~/.cargo`,
//!   `~/go`) and `requires COMMAND` lines (commands the integration needs,
//!   checked inside the sandbox before the first cycle, with the interpreter
//!   of `integration.sh`).
//!
//! Parsing and the command line are pure; [`stage`] copies the directory.

use std::path::{Path, PathBuf};

/// What `<harness>/sandbox` asks for.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SandboxNeeds {
    /// Host directories mounted read-only at the same path.
    pub paths: Vec<PathBuf>,
    /// Commands that must resolve inside the sandbox (a name on its `PATH`,
    /// or an absolute path).
    pub requires: Vec<String>,
}

/// Host paths a sandbox never gets, whatever a harness asks: the root, and
/// the kernel's and the machine's own state.
const NEVER: [&str; 7] = ["/", "/proc", "/sys", "/dev", "/root", "/etc", "/boot"];

/// Parses `<harness>/sandbox`. `control_plane` is the work store's directory:
/// neither it nor a directory holding it may be mounted.
pub fn parse_sandbox(text: &str, control_plane: &Path) -> Result<SandboxNeeds, String> {
    let mut needs = SandboxNeeds::default();
    for (index, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = |why: String| format!("line {}: {why}", index + 1);
        let (key, value) = line
            .split_once(char::is_whitespace)
            .ok_or_else(|| at("expected `path /absolute/dir` or `requires COMMAND`".into()))?;
        let value = value.trim();
        match key {
            "path" => {
                let path = PathBuf::from(value);
                if !path.is_absolute()
                    || path
                        .components()
                        .any(|c| matches!(c, std::path::Component::ParentDir))
                {
                    return Err(at(format!(
                        "`{value}` is not an absolute path without `..`"
                    )));
                }
                if NEVER.iter().any(|n| path == Path::new(n)) {
                    return Err(at(format!(
                        "`{value}` is the machine's own state; name the toolchain directory itself"
                    )));
                }
                if control_plane.starts_with(&path) || path.starts_with(control_plane) {
                    return Err(at(format!(
                        "`{value}` holds the Job Site's work store ({}); the sandbox never sees it",
                        control_plane.display()
                    )));
                }
                needs.paths.push(path);
            }
            "requires" => {
                if value.is_empty() || value.chars().any(char::is_whitespace) {
                    return Err(at("`requires` takes one command name or path".into()));
                }
                needs.requires.push(value.to_owned());
            }
            other => {
                return Err(at(format!(
                    "unknown key `{other}`: expected `path` or `requires`"
                )));
            }
        }
    }
    Ok(needs)
}

/// The argv that starts `script` (at `path` in the sandbox, with `text` its
/// content): its `#!` interpreter with the optional argument, as the kernel
/// reads the line, or `sh`.
pub fn script_command(path: &Path, text: &str) -> Vec<String> {
    let shown = path.display().to_string();
    let Some(line) = text.lines().next().and_then(|l| l.strip_prefix("#!")) else {
        return vec!["sh".into(), shown];
    };
    let line = line.trim();
    let (interpreter, argument) = match line.split_once(char::is_whitespace) {
        Some((i, a)) => (i, Some(a.trim()).filter(|a| !a.is_empty())),
        None => (line, None),
    };
    if interpreter.is_empty() {
        return vec!["sh".into(), shown];
    }
    let mut argv = vec![interpreter.to_owned()];
    argv.extend(argument.map(str::to_owned));
    argv.push(shown);
    argv
}

/// What must exist in the sandbox for `integration.sh` (its command line, as
/// [`script_command`] made it): its interpreter (the program `env` starts, for
/// `#!/usr/bin/env python3`), then the `requires` lines.
pub fn required_commands(integration: &[String], needs: &SandboxNeeds) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(first) = integration.first() {
        out.push(first.clone());
        if Path::new(first).file_name().is_some_and(|n| n == "env")
            && let Some(program) = integration.get(1).filter(|a| !a.starts_with('-'))
            && integration.len() > 2
        {
            out.push(program.clone());
        }
    }
    for r in &needs.requires {
        if !out.contains(r) {
            out.push(r.clone());
        }
    }
    out
}

/// The shell probe run in the sandbox: prints each of `commands` that does not
/// resolve to an executable file, one `missing: X` line each, to stderr, and
/// exits 3 if any is missing. A script's `#!` interpreter must exist too (a
/// venv's `bin/pytest` names the venv's `python`, which may link to a Python
/// outside the sandbox): a missing one is reported as `missing: INTERPRETER`.
pub fn probe_command(commands: &[String]) -> Vec<String> {
    const PROBE: &str = r#"missing=0
for c do
  p=$(command -v "$c" 2>/dev/null) && [ -x "$p" ] || { echo "missing: $c" >&2; missing=1; continue; }
  if [ "$(head -c 2 "$p" 2>/dev/null)" = '#!' ]; then
    i=$(head -n 1 "$p" | sed 's/^#![[:space:]]*//; s/[[:space:]].*//')
    [ -e "$i" ] || { echo "missing: $i (the interpreter of $c)" >&2; missing=1; }
  fi
done
[ "$missing" = 0 ] || exit 3"#;
    let mut argv = vec![
        "sh".to_owned(),
        "-c".to_owned(),
        PROBE.to_owned(),
        "probe".to_owned(),
    ];
    argv.extend(commands.iter().cloned());
    argv
}

/// The `missing: X` lines of a probe's stderr.
pub fn missing_from(stderr: &str) -> Vec<String> {
    stderr
        .split(['\n', '|'])
        .filter_map(|l| l.trim().strip_prefix("missing: "))
        .map(|s| s.trim().to_owned())
        .collect()
}

/// Copies the harness directory `from` to `to` (replaced whole), readable by
/// any uid: directories 0755, files 0644, or 0755 when executable. Symbolic
/// links are copied as the files or directories they name; anything else is
/// skipped. The copy is what the sandbox mounts: a harness under a directory
/// the sandbox's uid cannot enter still runs.
pub fn stage(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if to.exists() {
        std::fs::remove_dir_all(to)?;
    }
    let mut stack = vec![(from.to_path_buf(), to.to_path_buf(), 0usize)];
    while let Some((src, dst, depth)) = stack.pop() {
        std::fs::create_dir_all(&dst)?;
        std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o755))?;
        for entry in std::fs::read_dir(&src)? {
            let entry = entry?;
            let path = entry.path();
            let target = dst.join(entry.file_name());
            let meta = std::fs::metadata(&path)?;
            if meta.is_dir() {
                // Bounded: a link cycle cannot recurse forever.
                if depth < 32 {
                    stack.push((path, target, depth + 1));
                }
            } else if meta.is_file() {
                std::fs::copy(&path, &target)?;
                let mode = if meta.permissions().mode() & 0o111 != 0 {
                    0o755
                } else {
                    0o644
                };
                std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shebang_picks_the_interpreter_and_no_shebang_is_sh() {
        let p = Path::new("/h/integration.sh");
        assert_eq!(
            script_command(p, "#!/bin/bash\nset -o pipefail\n"),
            ["/bin/bash", "/h/integration.sh"]
        );
        assert_eq!(
            script_command(p, "#!/usr/bin/env python3\nprint(1)\n"),
            ["/usr/bin/env", "python3", "/h/integration.sh"]
        );
        assert_eq!(
            script_command(p, "#! /bin/sh -eu\n"),
            ["/bin/sh", "-eu", "/h/integration.sh"]
        );
        assert_eq!(script_command(p, "set -e\n"), ["sh", "/h/integration.sh"]);
        assert_eq!(script_command(p, "#!\n"), ["sh", "/h/integration.sh"]);
        assert_eq!(script_command(p, ""), ["sh", "/h/integration.sh"]);
    }

    #[test]
    fn the_sandbox_file_lists_paths_and_commands_and_refuses_what_it_must_not_mount() {
        let store = Path::new("/home/u/p/.git/protobot");
        let needs = parse_sandbox(
            "# toolchains\npath /opt/venv\n\nrequires /opt/venv/bin/pytest\nrequires git\n",
            store,
        )
        .unwrap();
        assert_eq!(needs.paths, [PathBuf::from("/opt/venv")]);
        assert_eq!(needs.requires, ["/opt/venv/bin/pytest", "git"]);
        for (text, expect) in [
            ("path venv", "absolute"),
            ("path /opt/../etc", "absolute"),
            ("path /", "machine's own state"),
            ("path /etc", "machine's own state"),
            ("path /home/u", "work store"),
            ("path /home/u/p/.git/protobot/clone", "work store"),
            ("requires two words", "one command"),
            ("mount /opt", "unknown key"),
            ("path", "expected"),
        ] {
            let err = parse_sandbox(text, store).unwrap_err();
            assert!(
                err.contains(expect) && err.starts_with("line 1"),
                "{text}: {err}"
            );
        }
    }

    #[test]
    fn the_integrations_interpreter_and_the_required_commands_are_probed() {
        let needs = SandboxNeeds {
            paths: vec![],
            requires: vec!["/opt/venv/bin/pytest".into()],
        };
        let env = script_command(Path::new("/h/i.sh"), "#!/usr/bin/env python3\n");
        assert_eq!(
            required_commands(&env, &needs),
            ["/usr/bin/env", "python3", "/opt/venv/bin/pytest"]
        );
        let sh = script_command(Path::new("/h/i.sh"), "echo\n");
        assert_eq!(required_commands(&sh, &SandboxNeeds::default()), ["sh"]);
        assert_eq!(
            missing_from("missing: python3 | missing: /opt/venv/bin/pytest"),
            ["python3", "/opt/venv/bin/pytest"]
        );
        assert!(missing_from("").is_empty());
        let probe = probe_command(&["a".into()]);
        assert_eq!(probe.last().map(String::as_str), Some("a"));
    }
}
