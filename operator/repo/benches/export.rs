//! Benchmark: projection export of a generated repository against
//! `git archive | tar -x && git init && git add -A && git commit` and against a plain
//! recursive copy of the same files (the floor). Prints the timings and the two ratios.
//!
//! Size: `PROTOBOT_BENCH_FILES` (default 20000) files totalling `PROTOBOT_BENCH_MB` (default
//! 200) MiB; `PROTOBOT_BENCH_RUNS` (default 3) rounds of the three steps, each step after a
//! `sync` into a fresh directory. Prints every round (wall and CPU time), the medians, the two
//! ratios of the medians and of the rounds, and whether each goal is met.
//! Run: `cargo bench -p protobot-repo --bench export` (needs `git`, `tar`, `cp`, `sync`).
//! Goal (issue 4): export ≥ 3× faster than the pipeline and ≤ 2× the copy. Then the source is
//! repacked (as a clone is) and the export measured again from the pack, against the same
//! medians.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{
    collections::BTreeMap,
    env, fs,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use git2::{Oid, Repository, Signature, Time};
use protobot_repo::{
    catalog::ChangeScope,
    export::{ExportRequest, export_projection},
    role::Role,
};

fn env_usize(name: &str, default: usize) -> usize {
    env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Default)]
struct Dir {
    files: BTreeMap<String, Oid>,
    dirs: BTreeMap<String, Dir>,
}

impl Dir {
    fn insert(&mut self, path: &str, id: Oid) {
        match path.split_once('/') {
            None => {
                self.files.insert(path.into(), id);
            }
            Some((head, rest)) => self.dirs.entry(head.into()).or_default().insert(rest, id),
        }
    }
    fn write(&self, repo: &Repository) -> Oid {
        let mut b = repo.treebuilder(None).unwrap();
        for (name, id) in &self.files {
            b.insert(name, *id, 0o100644).unwrap();
        }
        for (name, dir) in &self.dirs {
            b.insert(name, dir.write(repo), 0o040000).unwrap();
        }
        b.write().unwrap()
    }
}

/// Generates the source repository: files under `src/` (shared by the manifest so every role
/// exports the same set as the pipeline copies), deterministic source-like content.
fn generate(root: &Path, files: usize, total: usize) -> Repository {
    let repo = Repository::init(root).unwrap();
    let mut tree = Dir::default();
    let manifest = b"version: 1\npaths:\n  - path: src/\n    class: shared\n  - path: .protobot/projection.yaml\n    class: shared\n";
    tree.insert(".protobot/projection.yaml", repo.blob(manifest).unwrap());
    let per_file = (total / files).max(1);
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    // Source-like text (compressible like real code), different in every file.
    let mut buf = String::with_capacity(per_file + 64);
    for i in 0..files {
        buf.clear();
        while buf.len() < per_file {
            let r = next();
            buf.push_str(&format!(
                "    let v{} = f{}(x{}, {});\n",
                r % 9973,
                (r >> 16) % 997,
                (r >> 32) % 89,
                (r >> 48) % 10_000
            ));
        }
        buf.truncate(per_file);
        let path = format!("src/m{:03}/d{:02}/f{i:06}.rs", i % 200, (i / 200) % 50);
        tree.insert(&path, repo.blob(buf.as_bytes()).unwrap());
    }
    let tree_id = tree.write(&repo);
    let sig = Signature::new("bench", "bench@example.invalid", &Time::new(1, 0)).unwrap();
    {
        let tree = repo.find_tree(tree_id).unwrap();
        repo.commit(Some("refs/heads/main"), &sig, &sig, "bench", &tree, &[])
            .unwrap();
    }
    repo.set_head("refs/heads/main").unwrap();
    repo
}

fn sh(script: &str, dir: &Path) {
    let status = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "bench")
        .env("GIT_AUTHOR_EMAIL", "bench@example.invalid")
        .env("GIT_COMMITTER_NAME", "bench")
        .env("GIT_COMMITTER_EMAIL", "bench@example.invalid")
        .status()
        .unwrap();
    assert!(status.success(), "`{script}` failed");
}

fn time(f: impl FnOnce()) -> Duration {
    let start = Instant::now();
    f();
    start.elapsed()
}

/// CPU time (user + system) of this process (all threads) and of its waited-for children,
/// from `/proc/self/stat` (Linux; zero elsewhere). Less sensitive than wall time to other
/// load on a shared machine.
fn cpu() -> (Duration, Duration) {
    let Ok(stat) = fs::read_to_string("/proc/self/stat") else {
        return (Duration::ZERO, Duration::ZERO);
    };
    // Fields after the `(comm)`: state is field 3, utime 14, stime 15, cutime 16, cstime 17.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // /proc reports clock ticks of USER_HZ, 100 on Linux.
    let ticks = |n: u64| Duration::from_millis(n * 10);
    match fields.as_slice() {
        [utime, stime, cutime, cstime] => (ticks(utime + stime), ticks(cutime + cstime)),
        _ => (Duration::ZERO, Duration::ZERO),
    }
}

/// Wall time and CPU time of `f`; `children` picks the CPU of waited-for child processes.
fn measure(children: bool, f: impl FnOnce()) -> (Duration, Duration) {
    let before = cpu();
    let wall = time(f);
    let after = cpu();
    let used = if children {
        after.1.saturating_sub(before.1)
    } else {
        after.0.saturating_sub(before.0)
    };
    (wall, used)
}

fn main() {
    let files = env_usize("PROTOBOT_BENCH_FILES", 20_000);
    let total = env_usize("PROTOBOT_BENCH_MB", 200) * 1024 * 1024;
    let work = tempfile::TempDir::new().unwrap();
    let source = work.path().join("source");
    fs::create_dir_all(&source).unwrap();
    let gen_time = time(|| drop(generate(&source, files, total)));
    // The floor copies a plain checkout of the same files.
    let checkout = work.path().join("checkout");
    fs::create_dir_all(&checkout).unwrap();
    sh(
        &format!(
            "git -C {} archive main | tar -x -C {}",
            source.display(),
            checkout.display()
        ),
        work.path(),
    );
    println!(
        "generated {files} files, {} MiB in {gen_time:.2?}",
        total / (1024 * 1024)
    );

    let runs = env_usize("PROTOBOT_BENCH_RUNS", 3).max(1);
    let mut export = Vec::with_capacity(runs);
    let mut pipeline = Vec::with_capacity(runs);
    let mut copy = Vec::with_capacity(runs);
    let (mut faster_rounds, mut floor_rounds) = (Vec::new(), Vec::new());
    let (mut faster_cpu, mut floor_cpu) = (Vec::new(), Vec::new());
    for run in 1..=runs {
        // Each step starts with the page cache flushed of the previous step's writes and
        // writes into a fresh directory. Outputs are only removed at the end: on ext4, the
        // step right after a mass deletion pays for skipping the recently deleted inodes.
        let export_dest = work.path().join(format!("export-{run}"));
        sh("sync", work.path());
        let (export_wall, export_cpu) = measure(false, || {
            export_projection(&ExportRequest {
                source_repo: source.clone(),
                at: "main".into(),
                role: Role::WorkerB,
                dest: export_dest.clone(),
                scope: ChangeScope::default(),
            })
            .unwrap();
        });
        export.push(export_wall);

        let pipeline_dest = work.path().join(format!("pipeline-{run}"));
        fs::create_dir_all(&pipeline_dest).unwrap();
        sh("sync", work.path());
        // Auto gc is off: a `git gc --auto` detached after the commit would run into the
        // next measurements (and the removal below).
        let (pipeline_wall, pipeline_cpu) = measure(true, || {
            sh(
                &format!(
                    "git -C {src} archive main | tar -x -C {dst} && cd {dst} && git init -q && git add -A && git -c gc.auto=0 -c maintenance.auto=false commit -q -m projection",
                    src = source.display(),
                    dst = pipeline_dest.display()
                ),
                work.path(),
            )
        });
        pipeline.push(pipeline_wall);

        let copy_dest = work.path().join(format!("copy-{run}"));
        sh("sync", work.path());
        let (copy_wall, copy_cpu) = measure(true, || {
            sh(
                &format!("cp -r {} {}", checkout.display(), copy_dest.display()),
                work.path(),
            )
        });
        copy.push(copy_wall);

        let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
        let (e, p, c) = (export_wall, pipeline_wall, copy_wall);
        faster_rounds.push(ratio(p, e));
        floor_rounds.push(ratio(e, c));
        faster_cpu.push(ratio(pipeline_cpu, export_cpu));
        floor_cpu.push(ratio(export_cpu, copy_cpu));
        println!(
            "run {run}/{runs}: wall export {e:>8.2?}  pipeline {p:>8.2?}  copy {c:>8.2?}  \
             pipeline/export {:.2}x  export/copy {:.2}x",
            ratio(p, e),
            ratio(e, c)
        );
        println!(
            "           cpu  export {export_cpu:>8.2?}  pipeline {pipeline_cpu:>8.2?}  copy {copy_cpu:>8.2?}  \
             pipeline/export {:.2}x  export/copy {:.2}x",
            ratio(pipeline_cpu, export_cpu),
            ratio(export_cpu, copy_cpu)
        );
    }

    let (e, p, c) = (
        median(&mut export),
        median(&mut pipeline),
        median(&mut copy),
    );
    let faster = p.as_secs_f64() / e.as_secs_f64();
    let floor = e.as_secs_f64() / c.as_secs_f64();
    let verdict = |met: bool| if met { "met" } else { "NOT met" };
    println!("median of {runs} runs:");
    println!("export   {e:>10.2?}");
    println!(
        "pipeline {p:>10.2?}  export is {faster:.2}x faster (goal >= 3x: {})",
        verdict(faster >= 3.0)
    );
    println!(
        "copy     {c:>10.2?}  export is {floor:.2}x the copy (goal <= 2x: {})",
        verdict(floor <= 2.0)
    );
    let (fr, lr) = (
        median_f64(&mut faster_rounds),
        median_f64(&mut floor_rounds),
    );
    println!(
        "median of the per-round ratios: export is {fr:.2}x faster than the pipeline (goal >= 3x: {}), \
         {lr:.2}x the copy (goal <= 2x: {})",
        verdict(fr >= 3.0),
        verdict(lr <= 2.0)
    );
    println!(
        "median CPU-time ratios (user+sys, less sensitive to other load): pipeline/export {:.2}x, \
         export/copy {:.2}x",
        median_f64(&mut faster_cpu),
        median_f64(&mut floor_cpu)
    );

    // The production case: a canonical repository is a clone, so its objects are packed
    // (with deltas). Same files, same floor.
    sh("git -c gc.auto=0 repack -adq && git prune-packed", &source);
    let mut packed = Vec::with_capacity(runs);
    for run in 1..=runs {
        let dest = work.path().join(format!("export-packed-{run}"));
        sh("sync", work.path());
        let wall = time(|| {
            export_projection(&ExportRequest {
                source_repo: source.clone(),
                at: "main".into(),
                role: Role::WorkerB,
                dest: dest.clone(),
                scope: ChangeScope::default(),
            })
            .unwrap();
        });
        println!("run {run}/{runs}: export from the packed source {wall:>8.2?}");
        packed.push(wall);
    }
    let ep = median(&mut packed);
    println!(
        "export from a packed source {ep:>10.2?}: {:.2}x faster than the pipeline, {:.2}x the copy",
        p.as_secs_f64() / ep.as_secs_f64(),
        ep.as_secs_f64() / c.as_secs_f64()
    );
}

fn median_f64(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}
