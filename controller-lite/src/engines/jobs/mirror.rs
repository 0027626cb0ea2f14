//! Which job a node's registry mirror may be answered by: one whose image reference is
//! of the repository containerd asked under, at the registry it stands in for. Anything
//! else — another repository of the same registry, a private one included — is not the
//! job's to give.

/// Whether the job's `image` reference names `repository` at `registry` (a mirror
/// request's path and `ns`), both read as docker normalises them.
pub(super) fn same_repository(image: &str, repository: &str, registry: &str) -> bool {
    let Ok(reference) = image.parse::<oci_spec::distribution::Reference>() else {
        return false;
    };
    let registry = match registry {
        // Docker Hub's other names.
        "registry-1.docker.io" | "index.docker.io" => "docker.io",
        other => other,
    };
    reference.registry() == registry && reference.repository() == repository
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_jobs_own_repository_at_its_own_registry_is_answered() {
        let job = "registry.example:5000/team/app:1";
        assert!(same_repository(job, "team/app", "registry.example:5000"));
        assert!(!same_repository(
            job,
            "team/private",
            "registry.example:5000"
        ));
        assert!(!same_repository(job, "team/app", "other.example"));
        assert!(!same_repository(job, "team/app", ""));
        // Docker Hub's short names, as containerd spells the registry.
        assert!(same_repository("busybox:1", "library/busybox", "docker.io"));
        assert!(same_repository(
            "busybox@sha256:0000000000000000000000000000000000000000000000000000000000000000",
            "library/busybox",
            "registry-1.docker.io"
        ));
        assert!(!same_repository("not a reference", "x", "docker.io"));
    }
}
