//! Registry credentials against real registries (htpasswd and a bearer-token service):
//! they come from the docker config or pull secrets, go only to the host they are for,
//! only when it asks, and never ride a redirect or reach a mirror.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::path::Path;
use std::process::{Command, Output};

use rigger_integration_tests::{
    AuthRegistry, Lab, Proxy, TestNamespace, assert_ok, binary, image_records, mirror_hosts_dir,
    unique_image,
};
use serde_json::json;

/// `rigger-agent pull` of a full image reference over plain HTTP, with `DOCKER_CONFIG`
/// pointing into `dir` (so only credentials a test gives are used).
fn pull_without_default_credentials(ns: &str, image: &str, extra: &[&str], dir: &Path) -> Output {
    pull_with_hosts(Path::new("/nonexistent"), ns, image, extra, dir)
}

/// [`pull_without_default_credentials`] with the `hosts.toml` directory `hosts`.
fn pull_with_hosts(hosts: &Path, ns: &str, image: &str, extra: &[&str], dir: &Path) -> Output {
    Command::new(binary("rigger-agent"))
        .args(["pull", "--plain-http", "--registry-config"])
        .arg(hosts)
        .arg("--address")
        .arg(&Lab::get().containerd_address)
        .args(["--namespace", ns])
        .args(extra)
        .arg(image)
        .env("DOCKER_CONFIG", dir.join("nowhere"))
        .output()
        .unwrap()
}

#[test]
fn basic_auth_credentials_come_from_docker_config() {
    use rigger_integration_tests::AuthRegistry;

    let registry = AuthRegistry::start();
    registry.push("private/app");
    let ns = TestNamespace::new("auth");
    let dir = tempfile::tempdir().unwrap();
    let image = format!("{}/private/app:1", registry.address);
    let pull =
        |extra: &[&str]| pull_without_default_credentials(&ns.name, &image, extra, dir.path());

    // Without credentials: refused, one line, naming the image, nothing recorded.
    let out = pull(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let last = stderr.trim_end().lines().last().unwrap();
    assert!(last.contains(&image) && last.contains("denied"), "{last}");
    assert!(image_records(&ns.name).is_empty());

    // With the docker config: pulled. The password never shows in the output.
    let config = registry.docker_config(dir.path());
    let out = pull(&["--docker-config", config.to_str().unwrap()]);
    assert_ok(&out);
    assert!(!String::from_utf8_lossy(&out.stderr).contains(&registry.password));
    assert_eq!(image_records(&ns.name).len(), 1);
}

#[test]
fn bearer_tokens_are_fetched_with_docker_config_credentials() {
    use rigger_integration_tests::AuthRegistry;

    let registry = AuthRegistry::with_tokens(false);
    let repo_tag = unique_image("bearer", 2, 2 << 20);
    let image = format!("{}/{repo_tag}", registry.address);
    let ns = TestNamespace::new("bearer");
    let dir = tempfile::tempdir().unwrap();
    let pull =
        |extra: &[&str]| pull_without_default_credentials(&ns.name, &image, extra, dir.path());

    // No credentials, no token: refused in one line naming the image.
    let out = pull(&[]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.trim_end().lines().last().unwrap();
    assert!(last.contains(&image), "{last}");
    assert!(image_records(&ns.name).is_empty());
    assert!(registry.tokens_issued().is_empty());

    // The docker config's credentials buy a token from the token server; every blob is
    // fetched with it (the registry answers nothing without one).
    let config = registry.docker_config(dir.path());
    let out = pull(&["--docker-config", config.to_str().unwrap()]);
    assert_ok(&out);
    assert!(!String::from_utf8_lossy(&out.stderr).contains(&registry.password));
    assert_eq!(image_records(&ns.name).len(), 1);
    let repository = repo_tag.split(':').next().unwrap();
    let issued = registry.tokens_issued();
    assert!(
        issued.iter().any(|(account, scope)| account == "rigger"
            && scope == &format!("repository:{repository}:pull")),
        "{issued:?}"
    );
}

/// Pull `repo_tag` from a token registry without credentials; returns the tokens issued.
fn pull_anonymously(
    registry: &rigger_integration_tests::AuthRegistry,
    name: &str,
    extra: &[&str],
) -> Vec<(String, String)> {
    let lab = Lab::get();
    let repo_tag = unique_image(name, 3, 1 << 20);
    let ns = TestNamespace::new(name);
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(binary("rigger-agent"))
        .args(["pull", "--plain-http", "--registry-config", "/nonexistent"])
        .arg("--address")
        .arg(&lab.containerd_address)
        .args(["--namespace", &ns.name])
        .args(extra)
        .arg(format!("{}/{repo_tag}", registry.address))
        .env("DOCKER_CONFIG", dir.path())
        .output()
        .unwrap();
    assert_ok(&out);
    assert_eq!(image_records(&ns.name).len(), 1);
    registry.tokens_issued()
}

#[test]
fn anonymous_bearer_tokens_are_used_when_the_registry_allows_them() {
    let registry = rigger_integration_tests::AuthRegistry::with_tokens(true);
    let issued = pull_anonymously(&registry, "bearer-anonymous", &[]);
    assert!(
        !issued.is_empty() && issued.iter().all(|(account, _)| account.is_empty()),
        "{issued:?}"
    );
}

#[test]
fn an_expired_token_is_renewed_mid_pull() {
    use std::time::Duration;
    let lasting = rigger_integration_tests::AuthRegistry::with_tokens(true);
    // One connection at 512 KiB/s: the layers' requests come seconds apart.
    let slowly = ["--limit-rate", "512KiB", "--max-connections", "1"];
    let usual = pull_anonymously(&lasting, "bearer-lasting", &slowly).len();
    // Tokens accepted for 2 s: the later requests need new ones.
    let expiring =
        rigger_integration_tests::AuthRegistry::with_tokens_expiring(true, Duration::from_secs(2));
    let issued = pull_anonymously(&expiring, "bearer-expiry", &slowly);
    assert!(
        issued.len() > usual,
        "{} tokens with expiry, {usual} without",
        issued.len()
    );
}

#[test]
fn identity_tokens_are_traded_at_the_token_service_not_sent_raw() {
    let registry = AuthRegistry::with_tokens(false);
    let repo_tag = unique_image("identity", 2, 1 << 20);
    let image = format!("{}/{repo_tag}", registry.address);
    let ns = TestNamespace::new("identity");
    let dir = tempfile::tempdir().unwrap();
    let config = registry.identity_docker_config(dir.path());
    let out = pull_without_default_credentials(
        &ns.name,
        &image,
        &["--docker-config", config.to_str().unwrap()],
        dir.path(),
    );
    assert_ok(&out);
    assert_eq!(image_records(&ns.name).len(), 1);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains(registry.identity_token.as_deref().unwrap()));
    // Every token came from the refresh-token grant, with no Authorization header (the
    // identity token travels in the form, to the token service only).
    let grants = registry.token_grants();
    assert!(!grants.is_empty());
    assert!(
        grants
            .iter()
            .all(|(grant, authorization)| grant == "refresh_token" && !authorization),
        "{grants:?}"
    );
}

fn authorizations(proxy: &Proxy) -> Vec<String> {
    proxy
        .requests()
        .iter()
        .filter_map(|r| r["authorization"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn a_mirror_that_never_challenges_never_sees_the_registrys_credentials() {
    // The registry wants tokens bought with the docker config's credentials; the mirror
    // serves the same images and never asks for anything.
    let registry = AuthRegistry::with_tokens(false);
    let mirror = Proxy::start(&json!([]), &[]);
    let dir = tempfile::tempdir().unwrap();
    let mirror_url = format!("http://{}", mirror.address);
    let hosts = mirror_hosts_dir(dir.path(), &registry.address, &mirror_url, "");
    let config = registry.docker_config(dir.path());
    let with_config = ["--docker-config", config.to_str().unwrap()];

    let repo_tag = unique_image("mirror-creds", 3, 1 << 20);
    let ns = TestNamespace::new("mirror-creds");
    let image = format!("{}/{repo_tag}", registry.address);
    assert_ok(&pull_with_hosts(
        &hosts,
        &ns.name,
        &image,
        &with_config,
        dir.path(),
    ));
    assert_eq!(image_records(&ns.name).len(), 1);
    assert!(mirror.requests().len() >= 5, "{:?}", mirror.requests());
    assert_eq!(authorizations(&mirror), Vec::<String>::new());
    assert!(
        registry.tokens_issued().is_empty(),
        "the registry was not needed"
    );

    // The mirror lacks the blobs (404): they come from the registry, with its token;
    // the mirror still sees no credential.
    let mirror = Proxy::start(
        &json!([{"path_contains": "/blobs/", "action": {"status": 404}, "times": 1000}]),
        &[],
    );
    let mirror_url = format!("http://{}", mirror.address);
    let hosts = mirror_hosts_dir(&dir.path().join("404"), &registry.address, &mirror_url, "");
    let repo_tag = unique_image("mirror-404", 3, 1 << 20);
    let ns = TestNamespace::new("mirror-404");
    let image = format!("{}/{repo_tag}", registry.address);
    assert_ok(&pull_with_hosts(
        &hosts,
        &ns.name,
        &image,
        &with_config,
        dir.path(),
    ));
    assert_eq!(image_records(&ns.name).len(), 1);
    let refused = mirror
        .requests()
        .iter()
        .filter(|r| r["status"] == 404)
        .count();
    assert!(
        refused >= 4,
        "config and layers asked of the mirror first: {refused}"
    );
    assert_eq!(authorizations(&mirror), Vec::<String>::new());
    let issued = registry.tokens_issued();
    assert!(
        !issued.is_empty() && issued.iter().all(|(account, _)| account == "rigger"),
        "{issued:?}"
    );
}

#[test]
fn a_redirect_to_another_host_carries_no_credentials() {
    // Blobs of a token registry are redirected to "object storage" on another port.
    let registry = AuthRegistry::with_tokens(false);
    let storage = Proxy::start(&json!([]), &[]);
    let front = Proxy::start_to(
        &format!("http://{}", registry.address),
        &json!([{"path_contains": "/blobs/", "action": {"redirect": format!("http://{}", storage.address)}, "times": 1000}]),
        &[],
    );
    let dir = tempfile::tempdir().unwrap();
    // The credentials are for the host the image names: the front.
    let config = dir.path().join("config.json");
    std::fs::write(
        &config,
        json!({"auths": {front.address.as_str(): {"username": registry.user, "password": registry.password}}})
            .to_string(),
    )
    .unwrap();
    let repo_tag = unique_image("redirect", 2, 1 << 20);
    let ns = TestNamespace::new("redirect");
    let image = format!("{}/{repo_tag}", front.address);
    let out = pull_without_default_credentials(
        &ns.name,
        &image,
        &["--docker-config", config.to_str().unwrap()],
        dir.path(),
    );
    assert_ok(&out);
    assert_eq!(image_records(&ns.name).len(), 1);
    assert!(
        authorizations(&front).iter().any(|a| a == "Bearer"),
        "the front got its token"
    );
    let blobs: Vec<serde_json::Value> = storage
        .requests()
        .into_iter()
        .filter(|r| r["path"].as_str().unwrap().contains("/blobs/"))
        .collect();
    assert!(blobs.len() >= 3, "{blobs:?}");
    assert_eq!(authorizations(&storage), Vec::<String>::new());
}
