//! What the controller watches of a cluster (Kubernetes mode), where the cluster's own
//! objects are the truth: the Nodes' labels decide where jobs run ([`nodes`]), the Pods
//! say where a ContainerRecreateRequest's pod is and what it runs ([`pods`]), the
//! namespaces' labels what a SidecarSet's `namespaceSelector` matches ([`namespaces`]).
//! Each reads the API server through kube's client (the watches through [`watched`]);
//! the engines see only what they need (labels, [`pods::PodFacts`]).

pub mod namespaces;
pub mod nodes;
pub mod pods;
pub mod watched;
