//! Agents and memory pools: one CPU agent, `gpu_agents` GPU agents, and the pools each owns.

use crate::SoftHsaConfig;
use crate::handles::next_handle;
use hsa_sys::{
    HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED, HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_FINE_GRAINED,
    HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_KERNARG_INIT, HSA_STATUS_ERROR_OUT_OF_RESOURCES, hsa_status_t,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Granule and alignment of every runtime allocation (one page).
pub(crate) const ALLOC_GRANULE: usize = 4096;

/// Smallest and largest queue sizes (in packets) a GPU agent accepts.
pub(crate) const QUEUE_MIN_SIZE: u32 = 4;
pub(crate) const QUEUE_MAX_SIZE: u32 = 1 << 17;
/// Most queues one GPU agent may have at a time (each runs a packet-processor thread).
pub(crate) const QUEUES_MAX: u32 = 128;

/// CPU or GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AgentKind {
    Cpu,
    Gpu,
}

/// One agent of the topology.
pub(crate) struct Agent {
    pub(crate) handle: u64,
    pub(crate) kind: AgentKind,
    /// 0 for the CPU, 1.. for GPUs (also the HSA node id).
    pub(crate) node: u32,
    /// Indices into `Topology::pools`.
    pub(crate) pools: Vec<usize>,
}

/// What a pool is for; decides its segment and global flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PoolKind {
    /// Device memory, coarse-grained (the memory kernel replay snapshots).
    CoarseVram,
    /// Device memory, fine-grained.
    FineVram,
    /// Host memory usable for kernel arguments.
    Kernarg,
    /// Host (system) memory, fine-grained.
    System,
}

impl PoolKind {
    /// `HSA_AMD_MEMORY_POOL_INFO_GLOBAL_FLAGS` (same bit values as the region flags).
    pub(crate) fn global_flags(self) -> u32 {
        match self {
            PoolKind::CoarseVram => HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED,
            PoolKind::FineVram | PoolKind::System => HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_FINE_GRAINED,
            PoolKind::Kernarg => {
                HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_KERNARG_INIT
                    | HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_FINE_GRAINED
            }
        }
    }

    /// Host pools are reachable by every agent without `hsa_amd_agents_allow_access`.
    pub(crate) fn is_host(self) -> bool {
        matches!(self, PoolKind::Kernarg | PoolKind::System)
    }
}

/// A byte budget shared by the pools that draw on one memory (an agent's VRAM, or host memory).
/// It is a limit, not a reservation.
pub(crate) struct Budget {
    limit: u64,
    used: AtomicU64,
}

impl Budget {
    fn new(limit: u64) -> Arc<Self> {
        Arc::new(Self {
            limit,
            used: AtomicU64::new(0),
        })
    }

    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    /// Takes `bytes` from the budget or fails with `HSA_STATUS_ERROR_OUT_OF_RESOURCES`.
    pub(crate) fn reserve(&self, bytes: u64) -> Result<(), hsa_status_t> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&total| total <= self.limit)
            })
            .map(|_| ())
            .map_err(|_| HSA_STATUS_ERROR_OUT_OF_RESOURCES)
    }

    pub(crate) fn release(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// One memory pool (also exposed as a legacy region with the same handle).
pub(crate) struct Pool {
    pub(crate) handle: u64,
    /// Index of the owning agent in `Topology::agents`.
    pub(crate) agent: usize,
    pub(crate) kind: PoolKind,
    pub(crate) budget: Arc<Budget>,
}

/// All agents and pools of one runtime instance.
pub(crate) struct Topology {
    pub(crate) agents: Vec<Agent>,
    pub(crate) pools: Vec<Pool>,
}

impl Topology {
    pub(crate) fn new(config: &SoftHsaConfig) -> Self {
        let host = Budget::new(config.host_bytes);
        let mut agents = Vec::with_capacity(config.gpu_agents + 1);
        let mut pools = Vec::new();
        let mut add_pool = |agent: usize, kind: PoolKind, budget: &Arc<Budget>| {
            pools.push(Pool {
                handle: next_handle(),
                agent,
                kind,
                budget: budget.clone(),
            });
            pools.len() - 1
        };
        let cpu_pools = vec![
            add_pool(0, PoolKind::System, &host),
            add_pool(0, PoolKind::Kernarg, &host),
        ];
        agents.push(Agent {
            handle: next_handle(),
            kind: AgentKind::Cpu,
            node: 0,
            pools: cpu_pools,
        });
        for gpu in 0..config.gpu_agents {
            let index = agents.len();
            let vram = Budget::new(config.vram_bytes_per_agent);
            let gpu_pools = vec![
                add_pool(index, PoolKind::CoarseVram, &vram),
                add_pool(index, PoolKind::FineVram, &vram),
                add_pool(index, PoolKind::Kernarg, &host),
            ];
            agents.push(Agent {
                handle: next_handle(),
                kind: AgentKind::Gpu,
                node: u32::try_from(gpu + 1).unwrap_or(u32::MAX),
                pools: gpu_pools,
            });
        }
        Self { agents, pools }
    }

    /// The index of the agent with this handle.
    pub(crate) fn agent_index(&self, handle: u64) -> Option<usize> {
        self.agents.iter().position(|a| a.handle == handle)
    }

    /// The index of the pool (or region) with this handle.
    pub(crate) fn pool_index(&self, handle: u64) -> Option<usize> {
        self.pools.iter().position(|p| p.handle == handle)
    }
}
