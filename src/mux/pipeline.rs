//! The one admission pipeline of a forwarded `tools/call`.
//!
//! Every way a call reaches a child — the typed path, the hot path (raw JSON), a task-creating
//! call, the read-only retry after a crash, `catalog_dispatch` — passes these stages, in this
//! order, each written once:
//!
//! 1. **authorize**: the caller's scope covers `tools/call`;
//! 2. **resolve**: the name against the served view — visible, loaded (not for dispatch), not held
//!    by the drift guard, its child reachable by the caller (`Multiplexer::resolve`);
//! 3. **bounds**: the arguments within the child's limits, on the form the path holds (a map, or
//!    raw JSON on the hot path; a retry carries the arguments already checked);
//! 4. **deployment stages** ([`CallStage`], in [`MuxSettings::stages`] order): what a deployment
//!    adds (policy, rate limits, approvals).
//!
//! The requests that follow a task (`tasks/get|result|cancel|update`) are the caller's own task
//! (owner checked) on the task's child: they pass authorize and the deployment stages
//! ([`Entry::TaskFollowUp`], with the name of the tool that created the task).
//!
//! Admission has no side effect: a refusal is returned, never counted here (the hot path falls
//! back to the typed path on any refusal, which answers it; [`counted`] counts it once there).
//! What follows admission — the child's own admission, fair share and breaker, the exchange and
//! the settlement — is `ChildRuntime`'s.
//!
//! [`MuxSettings::stages`]: super::MuxSettings::stages

use std::sync::Arc;

use serde_json::value::RawValue;

use super::forward::ToolTarget;
use super::{Caller, Multiplexer, MuxError, Operation};

/// The arguments of a call, in the form its path holds.
#[derive(Clone, Copy)]
pub enum Arguments<'a> {
    /// Decoded (the typed path); `None` is no arguments.
    Map(Option<&'a serde_json::Map<String, serde_json::Value>>),
    /// As sent (the hot path); `None` is no arguments.
    Raw(Option<&'a RawValue>),
    /// Checked already by the attempt this one retries.
    Checked,
}

/// How the call came.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// A `tools/call` (typed, hot or task-creating): the tool must be loaded or eager.
    Call,
    /// `catalog_dispatch` names a tool of a published snapshot: it need not be loaded.
    Dispatch,
    /// A request that follows a task the tool created (`tasks/get`, `tasks/result`,
    /// `tasks/cancel`, `tasks/update`): the caller owns the task; `name` is the tool's.
    TaskFollowUp,
}

/// One call at admission.
pub struct Admission<'a> {
    /// Who calls.
    pub caller: &'a Caller,
    /// The exposed tool name.
    pub name: &'a str,
    /// Its arguments.
    pub arguments: Arguments<'a>,
    /// How it came.
    pub entry: Entry,
}

/// Where an admitted call goes, as a deployment stage sees it.
#[derive(Clone, Copy, Debug)]
pub struct Destination<'a> {
    /// The child.
    pub server: &'a str,
    /// The tool's name at the child.
    pub original: &'a str,
    /// The tool declares itself read-only.
    pub read_only: bool,
}

/// A check a deployment adds to every forwarded call after the built-in stages (see the module
/// note). It sees the caller, the name, the arguments and where the call would go; a refusal is
/// returned to the caller as is and nothing reaches the child.
pub trait CallStage: Send + Sync {
    /// The stage's name (logs and docs).
    fn name(&self) -> &'static str;
    /// Refuses the call, or lets it through.
    fn check(&self, call: &Admission<'_>, to: Destination<'_>) -> Result<(), MuxError>;
}

/// The deployment stages, in order.
#[derive(Clone, Default)]
pub struct Stages(pub Vec<Arc<dyn CallStage>>);

impl std::fmt::Debug for Stages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|s| s.name()))
            .finish()
    }
}

impl Multiplexer {
    /// Runs the pipeline: where the call goes, or why it does not.
    pub(super) fn admit_call(&self, call: &Admission<'_>) -> Result<ToolTarget, MuxError> {
        call.caller.authorize(Operation::CallTool)?;
        let target = self.resolve(call.caller, call.name, call.entry == Entry::Call)?;
        let limits = &target.child.spec().argument_limits;
        let bounded = match call.arguments {
            Arguments::Map(map) => {
                let empty = serde_json::Map::new();
                super::bounds::check_arguments(map.unwrap_or(&empty), limits)
            }
            Arguments::Raw(Some(raw)) => super::bounds::check_raw_arguments(raw, limits),
            Arguments::Raw(None) | Arguments::Checked => Ok(()),
        };
        if let Err(message) = bounded {
            return Err(MuxError::OutOfBounds {
                server: Some(target.server.clone()),
                message,
            });
        }
        self.deployment_stages(call, &target)?;
        Ok(target)
    }

    /// Stage 4 alone, for `catalog_dispatch`, whose first three stages answer with the
    /// generation contract's codes (see `generations`).
    pub(super) fn deployment_stages(
        &self,
        call: &Admission<'_>,
        target: &ToolTarget,
    ) -> Result<(), MuxError> {
        let to = Destination {
            server: &target.server,
            original: &target.original,
            read_only: target.read_only,
        };
        self.run_stages(call, to)
    }

    /// The deployment's stages, in order, for a call going to `to`.
    pub(super) fn run_stages(
        &self,
        call: &Admission<'_>,
        to: Destination<'_>,
    ) -> Result<(), MuxError> {
        for stage in &self.settings.stages.0 {
            stage.check(call, to)?;
        }
        Ok(())
    }
}

/// A refusal as the caller receives it, counted once (arguments out of bounds per server).
pub(super) fn counted<T>(admitted: Result<T, MuxError>) -> Result<T, MuxError> {
    if let Err(MuxError::OutOfBounds {
        server: Some(server),
        ..
    }) = &admitted
    {
        crate::telemetry::metrics().arguments_out_of_bounds(server);
    }
    admitted
}
