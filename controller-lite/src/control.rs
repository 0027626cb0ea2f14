//! The user API riggerctl speaks.

use std::time::{Duration, SystemTime};

use rigger_proto::v1::control_server::Control;
use rigger_proto::v1::{ListNodesRequest, ListNodesResponse};
use tonic::{Request, Response, Status};

use crate::nodes::NodeRegistry;

#[derive(Debug, Clone)]
pub struct ControlService {
    nodes: NodeRegistry,
    node_timeout: Duration,
}

impl ControlService {
    pub fn new(nodes: NodeRegistry, node_timeout: Duration) -> Self {
        Self {
            nodes,
            node_timeout,
        }
    }
}

#[tonic::async_trait]
impl Control for ControlService {
    async fn list_nodes(
        &self,
        _request: Request<ListNodesRequest>,
    ) -> Result<Response<ListNodesResponse>, Status> {
        Ok(Response::new(ListNodesResponse {
            nodes: self.nodes.list(SystemTime::now(), self.node_timeout),
        }))
    }
}
