//! `rigger-agent run`: config validation, readiness (HTTP and systemd), graceful stop.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::Duration;

use rigger_integration_tests::{Daemon, Lab, binary, free_port, http_get, wait_until};

fn write_config(dir: &std::path::Path, text: &str) -> std::path::PathBuf {
    let path = dir.join("agent.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn runs_reports_ready_to_systemd_and_stops_on_sigterm() {
    let lab = Lab::get();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write_config(
        dir.path(),
        &format!(
            "containerd_address = \"{}\"\nhealth_listen = \"127.0.0.1:{port}\"\nlog_format = \"json\"\ndrain_timeout = \"5s\"\nstate_dir = \"{}\"\n",
            lab.containerd_address.display(),
            dir.path().join("state").display()
        ),
    );
    // Stand in for systemd's notify socket.
    let notify_path = dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();

    let mut daemon = Daemon::spawn(
        Command::new(binary("rigger-agent"))
            .args(["run", "--config"])
            .arg(&config)
            .env("NOTIFY_SOCKET", &notify_path)
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );

    let mut buf = [0u8; 4096];
    let n = notify.recv(&mut buf).expect("READY=1 from the agent");
    let message = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(message.contains("READY=1"), "{message}");
    assert!(message.contains("STATUS=ready"), "{message}");
    // Its state (pod specs with their env values, task records) is root's alone.
    let mode = std::fs::metadata(dir.path().join("state"))
        .unwrap()
        .permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o700
    );

    let address = format!("127.0.0.1:{port}");
    assert_eq!(http_get(&address, "/healthz").unwrap().0, 200);
    let (code, body) = http_get(&address, "/readyz").unwrap();
    assert_eq!(code, 200, "{body}");
    let (code, body) = wait_until("inventory", Duration::from_secs(20), || {
        http_get(&address, "/inventory").filter(|(code, _)| *code == 200)
    });
    assert_eq!(code, 200);
    let inventory: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        inventory["runtime"]["address"],
        lab.containerd_address.to_str().unwrap()
    );

    let status = daemon.terminate(Duration::from_secs(10));
    assert!(status.success(), "exit status {status:?}");
    let mut stderr = String::new();
    std::io::Read::read_to_string(daemon.child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    // JSON logs, one object per line.
    for line in stderr.lines() {
        serde_json::from_str::<serde_json::Value>(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
    }
    assert!(stderr.contains("stopped cleanly"), "{stderr}");
    let n = notify.recv(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).contains("STOPPING=1"));
}

#[test]
fn not_ready_while_containerd_is_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut daemon = Daemon::spawn(
        Command::new(binary("rigger-agent"))
            .args(["run", "--address"])
            .arg(dir.path().join("missing.sock"))
            .args(["--health-listen", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    let address = format!("127.0.0.1:{port}");
    // Until its first look at containerd the agent is not ready for another reason.
    let (code, body) = wait_until("the readiness verdict", Duration::from_secs(20), || {
        http_get(&address, "/readyz").filter(|(_, body)| !body.contains("not contacted yet"))
    });
    assert_eq!(code, 503);
    assert!(body.contains("no containerd socket"), "{body}");
    assert_eq!(http_get(&address, "/healthz").unwrap().0, 200);
    assert!(daemon.terminate(Duration::from_secs(10)).success());
}

#[test]
fn bad_config_exits_64_naming_the_field_before_binding() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cases = [
        (
            format!("health_listen = \"127.0.0.1:{port}\"\ndrain_timeout = \"forever\"\n"),
            "drain_timeout",
        ),
        (
            format!("health_listen = \"127.0.0.1:{port}\"\nunknown_key = 1\n"),
            "unknown_key",
        ),
        ("health_listen = \"nowhere\"\n".to_owned(), "health_listen"),
    ];
    for (text, field) in cases {
        let config = write_config(dir.path(), &text);
        let mut daemon = Daemon::spawn(
            Command::new(binary("rigger-agent"))
                .args(["run", "--config"])
                .arg(&config)
                .stdout(Stdio::null())
                .stderr(Stdio::piped()),
        );
        let status = daemon.child.wait().unwrap();
        let mut stderr = String::new();
        std::io::Read::read_to_string(daemon.child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
        assert_eq!(status.code(), Some(64), "{text}: {stderr}");
        assert!(stderr.contains(field), "{text}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        // Nothing was bound.
        assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
    }

    // Env vars are validated the same way.
    let out = Command::new(binary("rigger-agent"))
        .arg("run")
        .env("RIGGER_LOG_FORMAT", "yaml")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("RIGGER_LOG_FORMAT"));
}
