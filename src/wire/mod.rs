//! The ground floor's wire helpers: byte-level marks graph-os reads and writes in MCP messages
//! without parsing them ([`needle`]: a key's value found in raw JSON; [`task_marks`]: the task
//! marks of both eras). Imports nothing of the crate.

pub mod needle;
pub mod task_marks;
