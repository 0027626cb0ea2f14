//! `rigger-agent status` against the real lab containerd.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::process::{Command, Stdio};

use rigger_integration_tests::{Lab, TestNamespace, agent};
use serde_json::Value;

fn status_json(args: &[&str]) -> Value {
    let lab = Lab::get();
    let address = lab.containerd_address.to_str().unwrap();
    let mut full = vec!["status", "--address", address, "-o", "json"];
    full.extend_from_slice(args);
    let out = agent(&full);
    assert!(
        out.status.success(),
        "status failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn image_pulled_by_ctr_shows_up_with_digest_and_size() {
    let lab = Lab::get();
    let ns = TestNamespace::new("status-image");
    let reference = lab.image("rigger-lab/multi:1");
    lab.ctr_pull(&ns.name, &reference);

    let inventory = status_json(&["--namespace", &ns.name]);
    let images = inventory["images"].as_array().unwrap();
    assert_eq!(images.len(), 1, "only the test's namespace: {images:?}");
    let image = &images[0];
    let (manifest, digest) = lab.manifest("rigger-lab/multi:1");
    assert_eq!(image["name"], reference.as_str());
    assert_eq!(image["namespace"], ns.name.as_str());
    assert_eq!(image["digest"], digest.as_str());
    // Size as `ctr images ls` counts it: manifest + config + layers.
    let manifest_len = serde_json::to_vec_pretty(&manifest).unwrap().len() as u64;
    let parts: u64 = manifest["config"]["size"].as_u64().unwrap()
        + manifest["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["size"].as_u64().unwrap())
            .sum::<u64>();
    let reported = image["size"].as_u64().unwrap();
    assert!(
        reported >= parts && reported <= parts + manifest_len + 4096,
        "size {reported} vs layers+config {parts}"
    );

    // The runtime section is real too.
    assert!(
        inventory["runtime"]["containerd"]["version"]
            .as_str()
            .unwrap()
            .starts_with("1.")
    );
    assert_eq!(inventory["runtime"]["cri"]["runtime_name"], "containerd");
    assert_eq!(
        inventory["runtime"]["root_dir"],
        lab.containerd_root.to_str().unwrap()
    );
    assert!(inventory["runtime"]["root_bytes_used"].as_u64().unwrap() > parts);
    assert!(inventory["host"]["cpus"].as_u64().unwrap() >= 1);
    assert!(inventory["host"]["memory_total_bytes"].as_u64().unwrap() > 0);
    assert!(
        inventory["host"]["filesystem"]["total_bytes"]
            .as_u64()
            .unwrap()
            > 0
    );

    // And the table a person reads names the image.
    let out = agent(&[
        "status",
        "--address",
        lab.containerd_address.to_str().unwrap(),
        "--namespace",
        &ns.name,
    ]);
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.contains(&reference), "{table}");
    assert!(table.contains("IMAGES (1)"), "{table}");
}

#[test]
fn all_namespaces_are_listed_by_default() {
    let lab = Lab::get();
    let first = TestNamespace::new("status-all-a");
    let second = TestNamespace::new("status-all-b");
    lab.ctr_pull(&first.name, &lab.image("rigger-lab/busybox:1"));
    lab.ctr_pull(&second.name, &lab.image("rigger-lab/pause:1"));
    let inventory = status_json(&["--no-disk-usage"]);
    let names: Vec<(String, String)> = inventory["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["namespace"].as_str().unwrap().to_owned(),
                i["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(names.contains(&(first.name.clone(), lab.image("rigger-lab/busybox:1"))));
    assert!(names.contains(&(second.name.clone(), lab.image("rigger-lab/pause:1"))));
    assert!(inventory["runtime"]["root_bytes_used"].is_null());
}

/// A node with a few thousand containers answers a container listing bigger than
/// tonic's default 4 MiB: the inventory reads it whole, as containerd's own client and
/// kubelet do (up to 16 MiB).
#[test]
fn a_container_listing_past_four_mib_is_read_whole() {
    use containerd_client::services::v1::containers_client::ContainersClient;
    use containerd_client::services::v1::{
        Container, CreateContainerRequest, DeleteContainerRequest,
    };

    const CONTAINERS: usize = 1100;
    let lab = Lab::get();
    let ns = TestNamespace::new("status-many");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let connected = runtime
        .block_on(rigger_runtime::Runtime::connect(
            &lab.containerd_address,
            rigger_runtime::DEFAULT_CONNECT_TIMEOUT,
        ))
        .unwrap();
    let mut containers = ContainersClient::new(connected.channel());
    let ids: Vec<String> = (0..CONTAINERS).map(|i| format!("many-{i}")).collect();
    // Removed at the end whatever happens: a namespace with containers outlives its test.
    struct Remove<'a> {
        runtime: &'a tokio::runtime::Runtime,
        client: ContainersClient<tonic::transport::Channel>,
        namespace: String,
        ids: &'a [String],
    }
    impl Drop for Remove<'_> {
        fn drop(&mut self) {
            for id in self.ids {
                let request = rigger_runtime::namespaced(
                    DeleteContainerRequest { id: id.clone() },
                    &self.namespace,
                )
                .unwrap();
                let _ = self.runtime.block_on(self.client.delete(request));
            }
        }
    }
    let _remove = Remove {
        runtime: &runtime,
        client: containers.clone(),
        namespace: ns.name.clone(),
        ids: &ids,
    };
    // Labels are containerd's largest field (4 KiB a label): about 4 KiB a record.
    let pad = "x".repeat(3900);
    for id in &ids {
        let container = Container {
            id: id.clone(),
            image: "rigger-lab/none:1".to_owned(),
            labels: [("pad".to_owned(), pad.clone())].into(),
            runtime: Some(containerd_client::services::v1::container::Runtime {
                name: "io.containerd.runc.v2".to_owned(),
                options: None,
            }),
            spec: Some(prost_types::Any {
                type_url: "types.containerd.io/opencontainers/runtime-spec/1/Spec".to_owned(),
                value: b"{}".to_vec(),
            }),
            ..Container::default()
        };
        let request = rigger_runtime::namespaced(
            CreateContainerRequest {
                container: Some(container),
            },
            &ns.name,
        )
        .unwrap();
        runtime.block_on(containers.create(request)).unwrap();
    }
    let inventory = status_json(&["--namespace", &ns.name, "--no-disk-usage"]);
    let listed = inventory["containers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["namespace"] == ns.name.as_str())
        .count();
    assert_eq!(listed, CONTAINERS);
}

/// A one-line error on stderr, a non-zero exit, nothing on stdout, no panic.
fn assert_clean_failure(out: &std::process::Output, expected: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        out.stdout.is_empty(),
        "stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains(expected), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn missing_socket_is_one_clear_line() {
    let out = agent(&["status", "--address", "/nonexistent/containerd.sock"]);
    assert_clean_failure(&out, "no containerd socket at /nonexistent/containerd.sock");
}

#[test]
fn unknown_namespace_is_named() {
    let lab = Lab::get();
    let out = agent(&[
        "status",
        "--address",
        lab.containerd_address.to_str().unwrap(),
        "--namespace",
        "no-such-namespace",
    ]);
    assert_clean_failure(&out, "\"no-such-namespace\"");
}

#[test]
fn socket_that_is_not_containerd_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("not-containerd.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    // An HTTP/1 server: answers, but not in gRPC.
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                use std::io::{Read, Write};
                let mut buf = [0u8; 1024];
                let _ = stream.read(&mut buf);
                let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
            });
        }
    });
    let out = agent(&["status", "--address", path.to_str().unwrap()]);
    assert_clean_failure(&out, "does not answer containerd's Version API");
}

#[test]
fn permission_denied_is_explained() {
    let lab = Lab::get();
    // The lab socket is root-only; run the agent as nobody.
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(rigger_integration_tests::binary("rigger-agent"))
        .args([
            "status",
            "--address",
            lab.containerd_address.to_str().unwrap(),
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_clean_failure(&out, "permission denied");
}
