//! Shell completions and man pages of the three binaries (what packages install).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::process::Command;

use rigger_integration_tests::binary;

#[test]
fn every_binary_prints_completions_and_a_man_page() {
    for (name, subcommand) in [
        ("riggerctl", "recreate"),
        ("rigger-agent", "pull"),
        ("rigger-controller", "certs"),
    ] {
        for shell in ["bash", "zsh", "fish"] {
            let out = Command::new(binary(name))
                .args(["completion", shell])
                .output()
                .unwrap();
            assert!(out.status.success(), "{name} completion {shell}");
            let text = String::from_utf8(out.stdout).unwrap();
            assert!(text.contains(subcommand), "{name} {shell}: {text}");
        }
        let out = Command::new(binary(name)).arg("manpage").output().unwrap();
        assert!(out.status.success());
        let page = String::from_utf8(out.stdout).unwrap();
        assert!(page.contains(&format!(".TH {name} 1")), "{page}");
        assert!(page.contains(subcommand), "{page}");
    }
    // A shell it does not know is refused like any bad argument.
    let out = Command::new(binary("riggerctl"))
        .args(["completion", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
}

/// docs/reference/ is generated from the config types; a changed flag or help text
/// must come with `make docs`.
#[test]
fn configuration_references_are_current() {
    for (name, file) in [
        ("rigger-agent", "agent-config.md"),
        ("rigger-controller", "controller-config.md"),
    ] {
        let out = Command::new(binary(name))
            .arg("config-reference")
            .output()
            .unwrap();
        assert!(out.status.success(), "{name} config-reference");
        let generated = String::from_utf8(out.stdout).unwrap();
        let path = rigger_integration_tests::repo_root()
            .join("docs/reference")
            .join(file);
        let committed = std::fs::read_to_string(&path).unwrap();
        assert!(
            committed == generated,
            "{} is stale: run `make docs`",
            path.display()
        );
    }
}

/// `riggerctl explain KIND` (kubectl's habit) prints a kind's reference without a
/// controller, by any of the kind's spellings; a kind without a page says which have one.
#[test]
fn explain_prints_a_kinds_reference_without_a_controller() {
    let out = Command::new(binary("riggerctl"))
        .args(["--server", "https://127.0.0.1:1", "explain", "crr"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = String::from_utf8(out.stdout).unwrap();
    assert!(page.starts_with("# ContainerRecreateRequest"), "{page}");
    assert!(
        page.contains("| `spec.containers[].statusContext.containerID` | string |"),
        "{page}"
    );
    let out = Command::new(binary("riggerctl"))
        .args(["explain", "node"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Node has no reference page yet (explained: imagepulljob"),
        "{stderr}"
    );
}
