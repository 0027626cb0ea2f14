//! The docs cannot rot: the README's quick starts and every guide's command blocks run
//! as written, against the lab. Each fenced block whose info string is `sh` is run, in
//! order, in one bash session per document (`set -euo pipefail`, a fresh directory and
//! `$HOME`, as root like the reader the README addresses); a guide's session runs the
//! README's quick start first, since every guide starts from it. Blocks shown but not
//! run are `text`, `yaml` or `toml`; the README's `sh setup` block (the packages and the
//! build) is what `make test` has done already, and is checked to say only that.
//!
//! What the lab changes, and nothing else: the public images the docs name are the lab
//! registry's copies (this machine has no internet), the agent reaches the lab's
//! containerd and registry through its environment (`RIGGER_CONTAINERD_ADDRESS`,
//! `RIGGER_AGENT_REGISTRY_CONFIG`), and the binaries are the debug build's.
//!
//! The `sh kubernetes` blocks (the README's cluster quick start) run against the lab's
//! API server with kubectl, in a directory holding a copy of `deploy/`, kubectl's
//! namespace the test's own. The lab has no kubelet to run the controller's Deployment
//! and the agents' DaemonSet those blocks apply: the test runs the same binaries in
//! their stead (a controller on the API server, an agent for Node `worker-1`), stand-ins
//! named as such.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Stdio};

use rigger_integration_tests::kubernetes::Cluster;
use rigger_integration_tests::{
    Lab, assert_ok, binary, code_blocks as blocks, lab_image, repo_root,
};

/// The public images the docs name, and the lab's copies.
fn lab_images() -> Vec<(&'static str, String)> {
    let lab = Lab::get();
    // A second version of the app image, for updates (busybox under one more layer).
    lab_image(&[
        "layers",
        "--name",
        "rigger-lab/busybox-next",
        "--count",
        "1",
        "--size",
        "4096",
    ]);
    vec![
        (
            "docker.io/library/busybox:1.36",
            lab.image("rigger-lab/busybox:1"),
        ),
        (
            "docker.io/library/busybox:1.37",
            lab.image("rigger-lab/busybox-next:1"),
        ),
    ]
}

/// The script of `documents`' blocks marked `info`, each announced on stderr by place.
fn script(documents: &[&str], info: &str) -> String {
    let images = lab_images();
    let mut script = String::from("set -euo pipefail\n");
    for document in documents {
        let text = std::fs::read_to_string(repo_root().join(document)).unwrap();
        let mut ran = 0;
        for block in blocks(&text) {
            match block.info.as_str() {
                runnable if runnable == info => {}
                "sh setup" => {
                    for line in block.text.lines().filter(|l| !l.trim().is_empty()) {
                        let command = line.split('#').next().unwrap().trim();
                        assert!(
                            command.is_empty()
                                || command.starts_with("make deps")
                                || command.starts_with("cargo build")
                                || command.starts_with("export PATH="),
                            "{document}:{}: a setup block may only install and build: {line}",
                            block.line
                        );
                    }
                    continue;
                }
                _ => continue,
            }
            ran += 1;
            let mut body = block.text;
            for (public, lab) in &images {
                body = body.replace(public, lab);
            }
            script.push_str(&format!("echo '### {document}:{}' >&2\n{body}", block.line));
        }
        assert!(ran > 0, "{document} has no `{info}` block");
    }
    script.push_str("echo '### done' >&2\n");
    script
}

/// How long one document's session may run: under the harness's limit
/// (.config/nextest.toml, 180 s), which kills the test with nothing said.
const SESSION_LIMIT: std::time::Duration = std::time::Duration::from_secs(150);

/// Run `documents`' `sh` blocks in one session; its daemons are stopped after.
fn run(documents: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    run_in(dir.path(), documents, "sh", &[], &[]);
}

/// Run `documents`' blocks marked `info` in one session under `dir`, with `env` and
/// more directories on `PATH`; the session's daemons are stopped after.
fn run_in(dir: &Path, documents: &[&str], info: &str, env: &[(&str, &Path)], more_path: &[&Path]) {
    let lab = Lab::get();
    let home = dir.join("home");
    let work = dir.join("work");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    let mut path: Vec<String> = vec![binary("riggerctl").parent().unwrap().display().to_string()];
    path.extend(more_path.iter().map(|p| p.display().to_string()));
    path.push(std::env::var("PATH").unwrap_or_default());
    let script = script(documents, info);
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(&work)
        .env_clear()
        .env("PATH", path.join(":"))
        .envs(env.iter().map(|(k, v)| (*k, *v)))
        .env("HOME", &home)
        .env("LANG", "C.UTF-8")
        .env("RIGGER_CONTAINERD_ADDRESS", &lab.containerd_address)
        .env("RIGGER_AGENT_REGISTRY_CONFIG", &lab.hosts_dir)
        // `rigger-agent pull` keeps its downloads in progress here, not the host's.
        .env("RIGGER_AGENT_STATE_DIR", home.join("agent-state"))
        // The lab's containerd shares this machine's disk (see .cargo/config.toml).
        .env("RIGGER_AGENT_IMAGE_FS_THRESHOLD_PERCENT", "100")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let pid = child.id();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || std::io::read_to_string(stdout).unwrap());
    let err = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap());
    // Ended before the harness's limit, so that a hang fails with its output and the
    // daemons' logs rather than with nothing.
    let (ended, watched) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        let hung = watched.recv_timeout(SESSION_LIMIT).is_err();
        if hung {
            signal_session(pid, "TERM");
        }
        hung
    });
    let status = child.wait().unwrap();
    let _ = ended.send(());
    let hung = watchdog.join().unwrap();
    // The daemons the docs started in the background go with the session.
    signal_session(pid, "TERM");
    std::thread::sleep(std::time::Duration::from_secs(1));
    signal_session(pid, "KILL");
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    // The docs' own daemons (under `home`) and the test's stand-ins (beside it).
    let logs: String = ["controller.log", "agent.log"]
        .iter()
        .filter_map(|name| find(dir, name))
        .map(|(path, text)| {
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            format!("--- {}\n{}\n", path.display(), tail.join("\n"))
        })
        .collect();
    let failed_at = err
        .lines()
        .rfind(|l| l.starts_with("### "))
        .unwrap_or("### before the first block")
        .to_owned();
    let how = if hung {
        format!("was still running after {} s", SESSION_LIMIT.as_secs())
    } else {
        format!("failed ({status})")
    };
    assert!(
        status.success() && failed_at == "### done",
        "{documents:?}: the block at {} {how}:\n--- stdout\n{out}\n--- stderr\n{err}\n{logs}",
        failed_at.trim_start_matches("### ")
    );
}

/// Send `signal` to every process of the session led by `pid` (its process group).
fn signal_session(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{signal}"), "--", &format!("-{pid}")])
        .status();
}

/// A file named `name` under `dir` (the session's daemons' logs), with its text.
fn find(dir: &Path, name: &str) -> Option<(std::path::PathBuf, String)> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = find(&path, name) {
                return Some(found);
            }
        } else if path.file_name().is_some_and(|n| n == name) {
            return Some((path.clone(), std::fs::read_to_string(&path).ok()?));
        }
    }
    None
}

#[test]
fn the_readme_quick_start_runs_as_written() {
    run(&["README.md"]);
}

#[test]
fn the_readme_fits_on_two_screens() {
    let text = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let lines = text.lines().count();
    assert!(
        lines <= 110,
        "README.md has {lines} lines: two screens are about 110"
    );
}

#[test]
fn every_guide_the_readme_links_exists() {
    let text = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let mut linked = 0;
    for part in text.split("](").skip(1) {
        let target = part.split(')').next().unwrap().split('#').next().unwrap();
        if target.starts_with("http") || target.is_empty() {
            continue;
        }
        linked += 1;
        assert!(
            repo_root().join(target).exists(),
            "README.md links {target}, which does not exist"
        );
    }
    assert!(linked >= 6, "{linked} links");
}

/// The README's cluster quick start, on the lab's API server, with stand-ins for what
/// kubelet would run (see the module's comment).
#[test]
fn the_readme_kubernetes_quick_start_runs_against_the_lab_cluster() {
    let cluster = Cluster::get();
    let _only_us = cluster.exclusive();
    let lab = Lab::get();
    let dir = tempfile::tempdir().unwrap();
    // What an earlier run left on the lab's API server (it outlives test runs).
    for args in [
        &["delete", "node", "worker-1", "--ignore-not-found"][..],
        &[
            "-n",
            "rigger-system",
            "delete",
            "secret",
            "rigger-controller-tls",
            "rigger-controller-tokens",
            "--ignore-not-found",
        ],
    ] {
        assert_ok(&cluster.kubectl(args));
    }
    // kubectl's namespace, for what the quick start makes without naming one.
    let namespace = cluster.namespace("docs");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::copy(&cluster.kubeconfig, &kubeconfig).unwrap();
    let out = Command::new(&cluster.binary)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args([
            "config",
            "set-context",
            "--current",
            "--namespace",
            &namespace.name,
        ])
        .output()
        .unwrap();
    assert_ok(&out);
    // "From this checkout": its deploy/.
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let copied = Command::new("cp")
        .arg("-r")
        .arg(repo_root().join("deploy"))
        .arg(&work)
        .status()
        .unwrap();
    assert!(copied.success());
    // Stand-ins for the Deployment's controller and the DaemonSet's agent on worker-1.
    let controller = cluster.controller(dir.path(), &namespace.name);
    let _agent = cluster.node_agent(
        &controller,
        dir.path(),
        "worker-1",
        &[],
        lab.first_node(),
        "k8s.io",
    );
    run_in(
        dir.path(),
        &["README.md"],
        "sh kubernetes",
        &[("KUBECONFIG", &kubeconfig)],
        &[cluster.binary.parent().unwrap()],
    );
    let _ = cluster.kubectl(&["delete", "node", "worker-1", "--ignore-not-found"]);
}

macro_rules! guides {
    ($($test:ident => $file:literal,)*) => {
        $(
            #[test]
            fn $test() {
                run(&["README.md", $file]);
            }
        )*
    };
}

guides! {
    the_pre_download_guide_runs_as_written => "docs/guides/pre-download.md",
    the_recreate_guide_runs_as_written => "docs/guides/recreate.md",
    the_in_place_update_guide_runs_as_written => "docs/guides/in-place-update.md",
    the_sidecarset_guide_runs_as_written => "docs/guides/sidecarset.md",
    the_pods_guide_runs_as_written => "docs/guides/pods.md",
    the_operations_guide_runs_as_written => "docs/guides/operations.md",
}
