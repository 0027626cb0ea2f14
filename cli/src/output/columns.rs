//! The columns `get` shows for each kind (`-o wide` adds some), as kubectl's printers do.

use serde_json::Value;

use super::{age, bytes, num_of, str_of};

/// The header and rows for `objects` (all of one kind).
pub fn table_rows(
    objects: &[Value],
    wide: bool,
    all_namespaces: bool,
) -> (Vec<String>, Vec<Vec<String>>) {
    let kind = objects
        .first()
        .map(|o| str_of(o, "/kind").to_owned())
        .unwrap_or_default();
    let mut header: Vec<&str> = Vec::new();
    if all_namespaces && kind != "Node" {
        header.push("NAMESPACE");
    }
    let mut rows = Vec::new();
    match kind.as_str() {
        "ImagePullJob" => {
            header.extend([
                "NAME",
                "TOTAL",
                "ACTIVE",
                "SUCCEEDED",
                "FAILED",
                "PROGRESS",
                "AGE",
                "MESSAGE",
            ]);
            if wide {
                header.push("IMAGE");
            }
            for o in objects {
                let (done, total) = o
                    .pointer("/status/nodes")
                    .and_then(Value::as_array)
                    .map(|nodes| {
                        nodes.iter().fold((0, 0), |(d, t), n| {
                            (d + num_of(n, "/bytesDone"), t + num_of(n, "/bytesTotal"))
                        })
                    })
                    .unwrap_or((0, 0));
                let progress = if total == 0 {
                    "-".to_owned()
                } else {
                    format!("{}/{}", bytes(done), bytes(total))
                };
                let mut row = Vec::new();
                if all_namespaces {
                    row.push(str_of(o, "/metadata/namespace").to_owned());
                }
                row.extend([
                    str_of(o, "/metadata/name").to_owned(),
                    num_of(o, "/status/desired").to_string(),
                    num_of(o, "/status/active").to_string(),
                    num_of(o, "/status/succeeded").to_string(),
                    num_of(o, "/status/failed").to_string(),
                    progress,
                    age(str_of(o, "/metadata/creationTimestamp")),
                    str_of(o, "/status/message").to_owned(),
                ]);
                if wide {
                    row.push(str_of(o, "/spec/image").to_owned());
                }
                rows.push(row);
            }
        }
        "Node" => {
            header.extend([
                "NAME",
                "STATUS",
                "AGENT",
                "CONTAINERD",
                "IMAGES",
                "PODS",
                "LAST HEARTBEAT",
            ]);
            if wide {
                header.extend(["LABELS", "REASON"]);
            }
            for o in objects {
                let ready = str_of(o, "/status/conditions/0/status") == "True";
                let mut row = vec![
                    str_of(o, "/metadata/name").to_owned(),
                    if ready { "Ready" } else { "NotReady" }.to_owned(),
                    str_of(o, "/status/nodeInfo/agentVersion").to_owned(),
                    str_of(o, "/status/nodeInfo/containerRuntimeVersion")
                        .trim_start_matches("containerd://")
                        .to_owned(),
                    o.pointer("/status/images")
                        .and_then(Value::as_array)
                        .map_or(0, Vec::len)
                        .to_string(),
                    num_of(o, "/status/pods").to_string(),
                    format!(
                        "{} ago",
                        age(str_of(o, "/status/conditions/0/lastHeartbeatTime"))
                    ),
                ];
                if wide {
                    let labels = o
                        .pointer("/metadata/labels")
                        .and_then(Value::as_object)
                        .map(|m| {
                            m.iter()
                                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                                .collect::<Vec<_>>()
                                .join(",")
                        })
                        .unwrap_or_default();
                    row.push(labels);
                    row.push(str_of(o, "/status/conditions/0/message").to_owned());
                }
                rows.push(row);
            }
        }
        "SidecarSet" => {
            header.extend(["NAME", "MATCHED", "UPDATED", "READY", "AGE"]);
            for o in objects {
                rows.push(vec![
                    str_of(o, "/metadata/name").to_owned(),
                    num_of(o, "/status/matchedPods").to_string(),
                    num_of(o, "/status/updatedPods").to_string(),
                    num_of(o, "/status/readyPods").to_string(),
                    age(str_of(o, "/metadata/creationTimestamp")),
                ]);
            }
        }
        "ContainerRecreateRequest" => {
            header.extend(["NAME", "POD", "PHASE", "CONTAINERS", "AGE"]);
            if wide {
                header.extend(["NODE", "MESSAGE"]);
            }
            for o in objects {
                let mut row = Vec::new();
                if all_namespaces {
                    row.push(str_of(o, "/metadata/namespace").to_owned());
                }
                let phase = match str_of(o, "/status/phase") {
                    "" => "Pending",
                    phase => phase,
                };
                let containers: Vec<String> = o
                    .pointer("/status/containerRecreateStates")
                    .and_then(Value::as_array)
                    .map(|states| {
                        states
                            .iter()
                            .map(|s| format!("{}={}", str_of(s, "/name"), str_of(s, "/phase")))
                            .collect()
                    })
                    .unwrap_or_default();
                row.extend([
                    str_of(o, "/metadata/name").to_owned(),
                    str_of(o, "/spec/podName").to_owned(),
                    phase.to_owned(),
                    containers.join(","),
                    age(str_of(o, "/metadata/creationTimestamp")),
                ]);
                if wide {
                    row.push(
                        str_of(o, "/metadata/labels/crr.apps.kruise.io~1node-name").to_owned(),
                    );
                    row.push(str_of(o, "/status/message").to_owned());
                }
                rows.push(row);
            }
        }
        "Pod" => {
            header.extend(["NAME", "READY", "STATUS", "RESTARTS", "LIFECYCLE", "AGE"]);
            if wide {
                header.extend(["NODE", "IMAGES", "WORKING SIDECARS"]);
            }
            for o in objects {
                let containers = o
                    .pointer("/spec/containers")
                    .and_then(Value::as_array)
                    .map_or(0, Vec::len);
                let statuses = o
                    .pointer("/status/containerStatuses")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let ready = statuses.iter().filter(|c| c["ready"] == true).count();
                let restarts: u64 = statuses.iter().map(|c| num_of(c, "/restartCount")).sum();
                let phase = match str_of(o, "/status/phase") {
                    "" => "Pending",
                    phase => phase,
                };
                let mut row = Vec::new();
                if all_namespaces {
                    row.push(str_of(o, "/metadata/namespace").to_owned());
                }
                row.extend([
                    str_of(o, "/metadata/name").to_owned(),
                    format!("{ready}/{containers}"),
                    phase.to_owned(),
                    restarts.to_string(),
                    match str_of(o, "/metadata/labels/lifecycle.rigger.dev~1state") {
                        "" => "-".to_owned(),
                        state => state.to_owned(),
                    },
                    age(str_of(o, "/metadata/creationTimestamp")),
                ]);
                if wide {
                    row.push(str_of(o, "/spec/nodeName").to_owned());
                    let images: Vec<&str> = o
                        .pointer("/spec/containers")
                        .and_then(Value::as_array)
                        .map(|cs| cs.iter().map(|c| str_of(c, "/image")).collect())
                        .unwrap_or_default();
                    row.push(images.join(","));
                    // Hot-upgrade sidecars: which slot serves (Kruise's annotation).
                    let working: std::collections::BTreeMap<String, String> = o
                        .pointer("/metadata/annotations/kruise.io~1sidecarset-working-hotupgrade-container")
                        .and_then(Value::as_str)
                        .and_then(|w| serde_json::from_str(w).ok())
                        .unwrap_or_default();
                    row.push(if working.is_empty() {
                        "-".to_owned()
                    } else {
                        working.into_values().collect::<Vec<_>>().join(",")
                    });
                }
                rows.push(row);
            }
        }
        _ => {
            header.extend(["NAME", "TYPE", "DATA", "AGE"]);
            for o in objects {
                let mut row = Vec::new();
                if all_namespaces {
                    row.push(str_of(o, "/metadata/namespace").to_owned());
                }
                row.extend([
                    str_of(o, "/metadata/name").to_owned(),
                    str_of(o, "/type").to_owned(),
                    o.pointer("/data")
                        .and_then(Value::as_object)
                        .map_or(0, serde_json::Map::len)
                        .to_string(),
                    age(str_of(o, "/metadata/creationTimestamp")),
                ]);
                rows.push(row);
            }
        }
    }
    (header.into_iter().map(str::to_owned).collect(), rows)
}
