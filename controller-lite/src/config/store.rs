//! The store settings: which backend (`store`), etcd's TLS, the Kubernetes API's
//! kubeconfig, namespace and `kruise_manager`, each checked with the others it needs.

use std::path::PathBuf;

use rigger_daemon::config::{ConfigError, Setting};

use super::check_pem;

/// Where objects live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreConfig {
    /// `<data_dir>/rigger.redb`; one replica.
    Embedded,
    /// etcd endpoints (`host:port`); replicas elect a leader.
    Etcd {
        endpoints: Vec<String>,
        tls: Option<EtcdTls>,
    },
    /// A Kubernetes API server; replicas elect a leader on a Lease.
    Kubernetes(rigger_store::KubernetesSettings),
}

pub use rigger_store::etcd::EtcdTls;

pub(super) const STORE: Setting = Setting {
    key: "store",
    flag: "--store",
    env: "RIGGER_CONTROLLER_STORE",
};
pub(super) const ETCD_CA_FILE: Setting = Setting {
    key: "etcd_ca_file",
    flag: "--etcd-ca-file",
    env: "RIGGER_CONTROLLER_ETCD_CA_FILE",
};
pub(super) const ETCD_CERT_FILE: Setting = Setting {
    key: "etcd_cert_file",
    flag: "--etcd-cert-file",
    env: "RIGGER_CONTROLLER_ETCD_CERT_FILE",
};
pub(super) const ETCD_KEY_FILE: Setting = Setting {
    key: "etcd_key_file",
    flag: "--etcd-key-file",
    env: "RIGGER_CONTROLLER_ETCD_KEY_FILE",
};
pub(super) const KUBECONFIG: Setting = Setting {
    key: "kubeconfig",
    flag: "--kubeconfig",
    env: "RIGGER_CONTROLLER_KUBECONFIG",
};
pub(super) const KUBERNETES_NAMESPACE: Setting = Setting {
    key: "kubernetes_namespace",
    flag: "--kubernetes-namespace",
    env: "RIGGER_CONTROLLER_KUBERNETES_NAMESPACE",
};
pub(super) const WRITE_NODE_IMAGES: Setting = Setting {
    key: "write_node_images",
    flag: "--write-node-images",
    env: "RIGGER_CONTROLLER_WRITE_NODE_IMAGES",
};
pub(super) const KRUISE_MANAGER: Setting = Setting {
    key: "kruise_manager",
    flag: "--kruise-manager",
    env: "RIGGER_CONTROLLER_KRUISE_MANAGER",
};
pub(super) fn parse_store(text: Option<String>) -> Result<StoreConfig, ConfigError> {
    let Some(text) = text else {
        return Ok(StoreConfig::Embedded);
    };
    if text == "embedded" {
        return Ok(StoreConfig::Embedded);
    }
    if text == "kubernetes" {
        return Ok(StoreConfig::Kubernetes(rigger_store::KubernetesSettings {
            kubeconfig: None,
            namespace: String::new(),
            kruise_manager: false,
            write_node_images: true,
        }));
    }
    let hosts = text.strip_prefix("etcd://").ok_or_else(|| {
        STORE.invalid(format!(
            "{text:?}: expected embedded, kubernetes or etcd://host:port[,host:port...]"
        ))
    })?;
    let endpoints: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
        .collect();
    if endpoints.is_empty() {
        return Err(STORE.invalid(format!("{text:?} names no etcd endpoint")));
    }
    for endpoint in &endpoints {
        let port = endpoint
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u16>().ok());
        if port.is_none() {
            return Err(STORE.invalid(format!("{endpoint:?} is not host:port")));
        }
    }
    Ok(StoreConfig::Etcd {
        endpoints,
        tls: None,
    })
}

/// The kubernetes store's settings, which need that store: a kubeconfig that exists,
/// a namespace that is a DNS label.
pub(super) fn kubernetes_settings(
    store: &mut StoreConfig,
    kubeconfig: Option<PathBuf>,
    namespace: Option<String>,
    kruise_manager: bool,
    write_node_images: Option<bool>,
) -> Result<(), ConfigError> {
    let StoreConfig::Kubernetes(settings) = store else {
        if write_node_images.is_some() {
            return Err(WRITE_NODE_IMAGES
                .invalid("applies to the kubernetes store only (store = \"kubernetes\")"));
        }
        if kruise_manager {
            return Err(KRUISE_MANAGER
                .invalid("applies to the kubernetes store only (store = \"kubernetes\")"));
        }
        if kubeconfig.is_some() {
            return Err(
                KUBECONFIG.invalid("applies to the kubernetes store only (store = \"kubernetes\")")
            );
        }
        if namespace.is_some() {
            return Err(KUBERNETES_NAMESPACE
                .invalid("applies to the kubernetes store only (store = \"kubernetes\")"));
        }
        return Ok(());
    };
    if let Some(path) = &kubeconfig
        && !path.is_file()
    {
        return Err(KUBECONFIG.invalid(format!("{}: no such file", path.display())));
    }
    let namespace = namespace
        .or_else(|| {
            std::env::var("POD_NAMESPACE")
                .ok()
                .filter(|n| !n.is_empty())
        })
        .unwrap_or_else(|| "rigger-system".to_owned());
    if !super::is_dns_label(&namespace) {
        return Err(KUBERNETES_NAMESPACE.invalid(format!("{namespace:?} is not a namespace name")));
    }
    settings.kubeconfig = kubeconfig;
    settings.namespace = namespace;
    settings.kruise_manager = kruise_manager;
    settings.write_node_images = write_node_images.unwrap_or(true);
    Ok(())
}

/// etcd's TLS settings, which need an etcd store and go together.
pub(super) fn etcd_tls(
    store: &StoreConfig,
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
) -> Result<Option<EtcdTls>, ConfigError> {
    let Some(ca) = ca else {
        if cert.is_some() {
            return Err(ETCD_CA_FILE.invalid("is needed with etcd_cert_file"));
        }
        if key.is_some() {
            return Err(ETCD_CA_FILE.invalid("is needed with etcd_key_file"));
        }
        return Ok(None);
    };
    if !matches!(store, StoreConfig::Etcd { .. }) {
        return Err(ETCD_CA_FILE.invalid("applies to an etcd store only (store = \"etcd://...\")"));
    }
    check_pem(ETCD_CA_FILE, &ca, "CERTIFICATE")?;
    let identity = match (cert, key) {
        (None, None) => None,
        (Some(_), None) => return Err(ETCD_KEY_FILE.invalid("is needed with etcd_cert_file")),
        (None, Some(_)) => return Err(ETCD_CERT_FILE.invalid("is needed with etcd_key_file")),
        (Some(cert), Some(key)) => {
            check_pem(ETCD_CERT_FILE, &cert, "CERTIFICATE")?;
            check_pem(ETCD_KEY_FILE, &key, "PRIVATE KEY")?;
            Some((cert, key))
        }
    };
    Ok(Some(EtcdTls { ca, identity }))
}
