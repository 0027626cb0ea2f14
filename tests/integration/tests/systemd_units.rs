//! The systemd units pass `systemd-analyze verify` (with ExecStart pointed at the built
//! binaries, as packages would install them under /usr/bin).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::process::Command;

use rigger_integration_tests::{binary, repo_root};

#[test]
fn units_verify_cleanly() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("systemd-analyze is missing (Debian package systemd)");
    }
    let dir = tempfile::tempdir().unwrap();
    for (unit, program) in [
        ("rigger-agent.service", "rigger-agent"),
        ("rigger-controller.service", "rigger-controller"),
    ] {
        let text = std::fs::read_to_string(repo_root().join("systemd").join(unit)).unwrap();
        assert!(text.contains("WatchdogSec="), "{unit} has a watchdog");
        assert!(text.contains("NoNewPrivileges=yes"), "{unit} is sandboxed");
        let text = text.replace(
            &format!("/usr/bin/{program}"),
            binary(program).to_str().unwrap(),
        );
        let path = dir.path().join(unit);
        std::fs::write(&path, text).unwrap();
        let out = Command::new("systemd-analyze")
            .arg("verify")
            // Documentation=man:... pages come with the packages (packaging/deb/test
            // checks they are there), not on this host.
            .arg("--man=no")
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{unit}: {stderr}");
        assert!(
            !stderr.contains(unit),
            "systemd-analyze has something to say about {unit}: {stderr}"
        );
    }
}
