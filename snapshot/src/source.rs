//! Where the regions of a snapshot come from, and how many regions and bytes each source gave.

use std::fmt;

/// Why a region is part of a snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum RegionSource {
    /// Selected by the filter's owner-agent and kind rule (the dispatch agent's memory).
    Agent,
    /// A tracked allocation that an address the dispatch uses (a kernel argument) points into,
    /// whatever its owner or kind.
    Referenced,
    /// A range outside the inventory that the caller vouches for: a module-scope variable of
    /// loaded code.
    ModuleVariable,
    /// An allocation the inventory did not know until the caller adopted it for this snapshot
    /// (base and size from the runtime), then reached like any other; it counts as adopted
    /// even where the owner-agent rule would now select it.
    Adopted,
}

impl RegionSource {
    /// Every source, in report order.
    pub const ALL: [RegionSource; 4] = [
        RegionSource::Agent,
        RegionSource::Referenced,
        RegionSource::ModuleVariable,
        RegionSource::Adopted,
    ];

    /// A short snake_case name (`agent`, `referenced`, `module_variable`, `adopted`).
    pub fn as_str(self) -> &'static str {
        match self {
            RegionSource::Agent => "agent",
            RegionSource::Referenced => "referenced",
            RegionSource::ModuleVariable => "module_variable",
            RegionSource::Adopted => "adopted",
        }
    }
}

impl fmt::Display for RegionSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Regions and bytes from one source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SourceTally {
    /// Regions.
    pub regions: u64,
    /// Bytes those regions cover.
    pub bytes: u64,
}

/// Regions and bytes of a snapshot per [`RegionSource`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct SourceBreakdown {
    /// [`RegionSource::Agent`].
    pub agent: SourceTally,
    /// [`RegionSource::Referenced`].
    pub referenced: SourceTally,
    /// [`RegionSource::ModuleVariable`].
    pub module_variables: SourceTally,
    /// [`RegionSource::Adopted`].
    pub adopted: SourceTally,
}

impl SourceBreakdown {
    /// The tally of one source.
    pub fn get(&self, source: RegionSource) -> SourceTally {
        match source {
            RegionSource::Agent => self.agent,
            RegionSource::Referenced => self.referenced,
            RegionSource::ModuleVariable => self.module_variables,
            RegionSource::Adopted => self.adopted,
        }
    }

    /// Counts one region of `bytes` from `source`.
    pub fn add(&mut self, source: RegionSource, bytes: u64) {
        let tally = match source {
            RegionSource::Agent => &mut self.agent,
            RegionSource::Referenced => &mut self.referenced,
            RegionSource::ModuleVariable => &mut self.module_variables,
            RegionSource::Adopted => &mut self.adopted,
        };
        tally.regions += 1;
        tally.bytes += bytes;
    }

    /// The breakdown of `regions` (sizes) labelled by `sources`.
    pub(crate) fn of<'a>(
        items: impl IntoIterator<Item = (&'a crate::Region, &'a RegionSource)>,
    ) -> Self {
        let mut b = SourceBreakdown::default();
        for (r, s) in items {
            b.add(*s, r.size);
        }
        b
    }
}

impl fmt::Display for SourceBreakdown {
    /// `agent 2 (8192 B), referenced 1 (4096 B), module variables 0 (0 B), adopted 0 (0 B)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "agent {} ({} B), referenced {} ({} B), module variables {} ({} B), adopted {} ({} B)",
            self.agent.regions,
            self.agent.bytes,
            self.referenced.regions,
            self.referenced.bytes,
            self.module_variables.regions,
            self.module_variables.bytes,
            self.adopted.regions,
            self.adopted.bytes
        )
    }
}
