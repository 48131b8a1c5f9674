//! Which processes a report covers, shared by the report and the GPU-use view.

use crate::model::Process;

/// Which processes to report.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub container: Option<String>,
    pub pid: Option<u32>,
}

impl Filter {
    pub(super) fn keeps(&self, p: &Process, container_name: &str) -> bool {
        self.pid.is_none_or(|pid| p.key.pid == pid)
            && self
                .container
                .as_ref()
                .is_none_or(|c| p.container.starts_with(c.as_str()) || container_name == c)
    }
}
