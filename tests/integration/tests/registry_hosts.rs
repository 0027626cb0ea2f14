//! `hosts.toml` as containerd reads it, against real registries: a mirror on a private
//! CA that wants a client certificate, `skip_verify` for every request (blobs too), a
//! mirror that needs a header, an API root moved by `override_path`, and a blob a mirror
//! lacks. The image's own host is a closed port, so a pull that works came from the
//! mirror.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::path::Path;
use std::process::{Command, Output};

use rigger_integration_tests::{
    Lab, Proxy, TestNamespace, TlsRegistry, assert_ok, binary, free_port, image_records,
    mirror_hosts_dir, unique_image,
};
use serde_json::json;

/// A registry host nothing listens on.
fn closed_host() -> String {
    format!("127.0.0.1:{}", free_port())
}

fn pull(hosts: &Path, ns: &str, image: &str) -> Output {
    Command::new(binary("rigger-agent"))
        .args(["pull", "--registry-config"])
        .arg(hosts)
        .arg("--address")
        .arg(&Lab::get().containerd_address)
        .args(["--namespace", ns])
        .arg(image)
        .env("DOCKER_CONFIG", "/nonexistent")
        .output()
        .unwrap()
}

/// The last stderr line of a pull that must have failed, with nothing recorded.
fn refused(out: &Output, ns: &str) -> String {
    assert!(!out.status.success());
    assert!(image_records(ns).is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    stderr
        .trim_end()
        .lines()
        .last()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn a_mirror_on_a_private_ca_with_a_client_certificate() {
    let mirror = TlsRegistry::start(true);
    let certs = mirror.dir().display();
    let repo_tag = unique_image("private-ca", 2, 1 << 20);
    let registry = closed_host();
    let image = format!("{registry}/{repo_tag}");
    let dir = tempfile::tempdir().unwrap();
    let mirror_url = format!("https://{}", mirror.address);
    let with = |settings: &str, name: &str| {
        mirror_hosts_dir(&dir.path().join(name), &registry, &mirror_url, settings)
    };
    let ca = format!("  ca = \"{certs}/ca.pem\"\n");
    let client = format!("  client = [[\"{certs}/client.pem\", \"{certs}/client.key\"]]\n");

    let ns = TestNamespace::new("private-ca");
    assert_ok(&pull(
        &with(&format!("{ca}{client}"), "both"),
        &ns.name,
        &image,
    ));
    assert_eq!(image_records(&ns.name).len(), 1);

    // Without the CA the mirror is not trusted; without the client certificate it
    // refuses the handshake. Either way: one line naming the mirror and why.
    let ns = TestNamespace::new("no-ca");
    let last = refused(&pull(&with(&client, "no-ca"), &ns.name, &image), &ns.name);
    assert!(
        last.contains(&mirror.address) && last.contains("certificate"),
        "{last}"
    );
    let ns = TestNamespace::new("no-client");
    let last = refused(&pull(&with(&ca, "no-client"), &ns.name, &image), &ns.name);
    assert!(last.contains(&mirror.address), "{last}");

    // A CA file that is not there is named.
    let ns = TestNamespace::new("missing-ca");
    let missing = format!("  ca = \"{certs}/missing.pem\"\n{client}");
    let last = refused(
        &pull(&with(&missing, "missing"), &ns.name, &image),
        &ns.name,
    );
    assert!(
        last.contains("missing.pem") && last.contains("hosts.toml"),
        "{last}"
    );
}

#[test]
fn skip_verify_holds_for_blobs_too() {
    let mirror = TlsRegistry::start(false);
    let repo_tag = unique_image("skip-verify", 3, 1 << 20);
    let registry = closed_host();
    let dir = tempfile::tempdir().unwrap();
    let hosts = mirror_hosts_dir(
        dir.path(),
        &registry,
        &format!("https://{}", mirror.address),
        "  skip_verify = true\n",
    );
    let ns = TestNamespace::new("skip-verify");
    assert_ok(&pull(&hosts, &ns.name, &format!("{registry}/{repo_tag}")));
    assert_eq!(image_records(&ns.name).len(), 1);
}

#[test]
fn a_mirror_that_needs_a_header() {
    let mirror = Proxy::start(&json!([]), &["--require-header", "x-mirror-token=s3cret"]);
    let repo_tag = unique_image("header", 2, 1 << 20);
    let registry = closed_host();
    let image = format!("{registry}/{repo_tag}");
    let dir = tempfile::tempdir().unwrap();
    let mirror_url = format!("http://{}", mirror.address);

    let ns = TestNamespace::new("header");
    let hosts = mirror_hosts_dir(
        &dir.path().join("with"),
        &registry,
        &mirror_url,
        "  header = { x-mirror-token = \"s3cret\" }\n",
    );
    assert_ok(&pull(&hosts, &ns.name, &image));
    assert_eq!(image_records(&ns.name).len(), 1);
    let served = mirror.requests();
    assert!(
        served
            .iter()
            .any(|r| r["path"].as_str().unwrap().contains("/blobs/"))
    );
    assert!(served.iter().all(|r| r["status"] != 403), "{served:?}");

    let ns = TestNamespace::new("no-header");
    let hosts = mirror_hosts_dir(&dir.path().join("without"), &registry, &mirror_url, "");
    let last = refused(&pull(&hosts, &ns.name, &image), &ns.name);
    assert!(last.contains(&image), "{last}");
}

#[test]
fn override_path_puts_the_api_where_the_url_says() {
    let mirror = Proxy::start(&json!([]), &["--api-root", "/registry/api"]);
    let repo_tag = unique_image("override-path", 2, 1 << 20);
    let registry = closed_host();
    let dir = tempfile::tempdir().unwrap();
    let hosts = mirror_hosts_dir(
        dir.path(),
        &registry,
        &format!("http://{}/registry/api", mirror.address),
        "  override_path = true\n",
    );
    let ns = TestNamespace::new("override-path");
    assert_ok(&pull(&hosts, &ns.name, &format!("{registry}/{repo_tag}")));
    assert_eq!(image_records(&ns.name).len(), 1);
    let served = mirror.requests();
    assert!(
        served
            .iter()
            .all(|r| r["path"].as_str().unwrap().starts_with("/registry/api/")),
        "{served:?}"
    );
}

#[test]
fn a_blob_a_mirror_lacks_comes_from_the_next_host() {
    // The mirror has the manifests but answers 404 for every blob (config and layers).
    let mirror = Proxy::start(
        &json!([{"path_contains": "/blobs/", "action": {"status": 404}, "times": 1000}]),
        &[],
    );
    let lab = Lab::get();
    let repo_tag = unique_image("mirror-lacks", 3, 1 << 20);
    let dir = tempfile::tempdir().unwrap();
    let hosts = mirror_hosts_dir(
        dir.path(),
        &lab.registry,
        &format!("http://{}", mirror.address),
        "",
    );
    let ns = TestNamespace::new("mirror-lacks");
    assert_ok(&pull(
        &hosts,
        &ns.name,
        &format!("{}/{repo_tag}", lab.registry),
    ));
    assert_eq!(image_records(&ns.name).len(), 1);
    let lacked = mirror
        .requests()
        .iter()
        .filter(|r| r["status"] == 404)
        .count();
    assert!(
        lacked >= 4,
        "config and 3 layers asked of the mirror first: {lacked}"
    );
}
