//! kubectl against one cluster as its admin: what every test of a Kubernetes API server
//! runs (the lab's test API server, `kubernetes`, and its real cluster, `real_cluster`,
//! both of which deref to their [`Kubectl`]).

use std::path::PathBuf;
use std::process::{Command, Output};

/// kubectl and the admin kubeconfig of one cluster.
#[derive(Debug, Clone)]
pub struct Kubectl {
    pub binary: PathBuf,
    pub kubeconfig: PathBuf,
}

impl Kubectl {
    /// kubectl with the admin kubeconfig.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.binary);
        command.arg("--kubeconfig").arg(&self.kubeconfig).args(args);
        command
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    /// kubectl's standard output; panics with its error when it fails.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// `kubectl ARGS -f -` with `stdin`.
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Output {
        crate::output_with_stdin(self.command(args).args(["-f", "-"]), stdin)
    }

    /// `kubectl get ARGS -o json`, parsed; `None` when it fails (absent).
    pub fn get_json(&self, args: &[&str]) -> Option<serde_json::Value> {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "json"]);
        let out = self.kubectl(&all);
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).unwrap())
    }
}
