//! Attribute values of the `*_get_info` entry points, encoded as the bytes the caller's buffer
//! receives (native endianness, sizes as the headers declare them).

use crate::runtime::Runtime;
use crate::time::{TIMESTAMP_FREQUENCY, now_ticks};
use crate::topology::{ALLOC_GRANULE, AgentKind, QUEUE_MAX_SIZE, QUEUE_MIN_SIZE, QUEUES_MAX};
use hsa_sys::*;
use std::mem::{offset_of, size_of};

/// The ISA every GPU agent reports (its only ISA).
pub(crate) const ISA_NAME: &str = "amdgcn-amd-amdhsa--softgpu";
/// Handle of that ISA.
pub(crate) const ISA_HANDLE: u64 = 0x6b72_0000_0015_a000;
/// Handle of the ISA's only wavefront.
pub(crate) const WAVEFRONT_HANDLE: u64 = 0x6b72_0000_0000_3e40;
const WAVEFRONT_SIZE: u32 = 64;
const WORKGROUP_MAX_SIZE: u32 = 1024;
const GPU_NAME: &str = "softgpu";
const CPU_NAME: &str = "softcpu";
const VENDOR: &str = "kreplay";
/// `HSA_AMD_SYSTEM_INFO_BUILD_VERSION` points at this string.
pub(crate) static BUILD_VERSION: &std::ffi::CStr = c"kreplay-softhsa 0.1.0";

type Info = Result<Vec<u8>, hsa_status_t>;

fn u16v(v: u16) -> Info {
    Ok(v.to_ne_bytes().to_vec())
}
fn u32v(v: u32) -> Info {
    Ok(v.to_ne_bytes().to_vec())
}
fn u64v(v: u64) -> Info {
    Ok(v.to_ne_bytes().to_vec())
}
fn usizev(v: usize) -> Info {
    Ok(v.to_ne_bytes().to_vec())
}
fn boolv(v: bool) -> Info {
    Ok(vec![u8::from(v)])
}
/// A NUL-terminated string in a fixed `len`-byte field.
fn strv(s: &str, len: usize) -> Info {
    let mut bytes = vec![0u8; len];
    let n = s.len().min(len - 1);
    bytes[..n].copy_from_slice(&s.as_bytes()[..n]);
    Ok(bytes)
}
fn u32s(values: &[u32]) -> Info {
    Ok(values.iter().flat_map(|v| v.to_ne_bytes()).collect())
}

/// `hsa_system_get_info`.
pub(crate) fn system(attribute: hsa_system_info_t) -> Info {
    match attribute {
        HSA_SYSTEM_INFO_VERSION_MAJOR => u16v(1),
        HSA_SYSTEM_INFO_VERSION_MINOR => u16v(1),
        HSA_SYSTEM_INFO_TIMESTAMP => u64v(now_ticks()),
        HSA_SYSTEM_INFO_TIMESTAMP_FREQUENCY => u64v(TIMESTAMP_FREQUENCY),
        HSA_SYSTEM_INFO_SIGNAL_MAX_WAIT => u64v(u64::MAX),
        HSA_SYSTEM_INFO_ENDIANNESS => u32v(HSA_ENDIANNESS_LITTLE),
        HSA_SYSTEM_INFO_MACHINE_MODEL => u32v(HSA_MACHINE_MODEL_LARGE),
        HSA_SYSTEM_INFO_EXTENSIONS => Ok(vec![0u8; 128]),
        HSA_AMD_SYSTEM_INFO_BUILD_VERSION => usizev(BUILD_VERSION.as_ptr() as usize),
        HSA_AMD_SYSTEM_INFO_SVM_SUPPORTED => boolv(
            crate::runtime::current()
                .is_ok_and(|r| r.config.svm_supported || r.config.svm_accessible_by_default),
        ),
        HSA_AMD_SYSTEM_INFO_SVM_ACCESSIBLE_BY_DEFAULT => {
            boolv(crate::runtime::current().is_ok_and(|r| r.config.svm_accessible_by_default))
        }
        _ => Err(HSA_STATUS_ERROR_INVALID_ARGUMENT),
    }
}

/// `hsa_agent_get_info` for agent `index`.
pub(crate) fn agent(rt: &Runtime, index: usize, attribute: hsa_agent_info_t) -> Info {
    let agent = &rt.topology.agents[index];
    let gpu = agent.kind == AgentKind::Gpu;
    let gpu_or = |v: u32| if gpu { v } else { 0 };
    // The pool's size, fixed when the runtime started: asking the system again would read its
    // CPU configuration (affinity, cgroup quota files) on every query.
    let compute_units = u32::try_from(rt.workers.count() + 1).unwrap_or(u32::MAX);
    match attribute {
        HSA_AGENT_INFO_NAME => strv(if gpu { GPU_NAME } else { CPU_NAME }, 64),
        HSA_AGENT_INFO_VENDOR_NAME => strv(VENDOR, 64),
        HSA_AGENT_INFO_FEATURE => u32v(if gpu {
            HSA_AGENT_FEATURE_KERNEL_DISPATCH
        } else {
            HSA_AGENT_FEATURE_AGENT_DISPATCH
        }),
        HSA_AGENT_INFO_MACHINE_MODEL => u32v(HSA_MACHINE_MODEL_LARGE),
        HSA_AGENT_INFO_PROFILE => u32v(if gpu {
            HSA_PROFILE_BASE
        } else {
            HSA_PROFILE_FULL
        }),
        HSA_AGENT_INFO_DEFAULT_FLOAT_ROUNDING_MODE => u32v(HSA_DEFAULT_FLOAT_ROUNDING_MODE_NEAR),
        HSA_AGENT_INFO_BASE_PROFILE_DEFAULT_FLOAT_ROUNDING_MODES => {
            u32v(HSA_DEFAULT_FLOAT_ROUNDING_MODE_NEAR)
        }
        HSA_AGENT_INFO_FAST_F16_OPERATION => boolv(gpu),
        HSA_AGENT_INFO_WAVEFRONT_SIZE => u32v(gpu_or(WAVEFRONT_SIZE)),
        HSA_AGENT_INFO_WORKGROUP_MAX_DIM => {
            let dim = if gpu { WORKGROUP_MAX_SIZE as u16 } else { 0 };
            Ok([dim; 3].iter().flat_map(|v| v.to_ne_bytes()).collect())
        }
        HSA_AGENT_INFO_WORKGROUP_MAX_SIZE => u32v(gpu_or(WORKGROUP_MAX_SIZE)),
        HSA_AGENT_INFO_GRID_MAX_DIM => u32s(&[gpu_or(u32::MAX); 3]),
        HSA_AGENT_INFO_GRID_MAX_SIZE => u32v(gpu_or(u32::MAX)),
        HSA_AGENT_INFO_FBARRIER_MAX_SIZE => u32v(gpu_or(32)),
        HSA_AGENT_INFO_QUEUES_MAX => u32v(gpu_or(QUEUES_MAX)),
        HSA_AGENT_INFO_QUEUE_MIN_SIZE => u32v(gpu_or(QUEUE_MIN_SIZE)),
        HSA_AGENT_INFO_QUEUE_MAX_SIZE => u32v(gpu_or(QUEUE_MAX_SIZE)),
        HSA_AGENT_INFO_QUEUE_TYPE => u32v(HSA_QUEUE_TYPE_MULTI),
        HSA_AGENT_INFO_NODE => u32v(agent.node),
        HSA_AGENT_INFO_DEVICE => u32v(if gpu {
            HSA_DEVICE_TYPE_GPU
        } else {
            HSA_DEVICE_TYPE_CPU
        }),
        HSA_AGENT_INFO_CACHE_SIZE => u32s(&[32 * 1024, 4 * 1024 * 1024, 0, 0]),
        HSA_AGENT_INFO_ISA if gpu => u64v(ISA_HANDLE),
        HSA_AGENT_INFO_EXTENSIONS => Ok(vec![0u8; 128]),
        HSA_AGENT_INFO_VERSION_MAJOR => u16v(1),
        HSA_AGENT_INFO_VERSION_MINOR => u16v(1),
        HSA_AMD_AGENT_INFO_CHIP_ID => u32v(if gpu { 0x50f7 } else { 0 }),
        HSA_AMD_AGENT_INFO_CACHELINE_SIZE => u32v(64),
        HSA_AMD_AGENT_INFO_COMPUTE_UNIT_COUNT => u32v(compute_units),
        HSA_AMD_AGENT_INFO_MAX_CLOCK_FREQUENCY => u32v(1000),
        HSA_AMD_AGENT_INFO_DRIVER_NODE_ID => u32v(agent.node),
        HSA_AMD_AGENT_INFO_MAX_ADDRESS_WATCH_POINTS => u32v(0),
        HSA_AMD_AGENT_INFO_BDFID => u32v(agent.node << 8),
        HSA_AMD_AGENT_INFO_MEMORY_WIDTH => u32v(gpu_or(64)),
        HSA_AMD_AGENT_INFO_MEMORY_MAX_FREQUENCY => u32v(gpu_or(1000)),
        HSA_AMD_AGENT_INFO_PRODUCT_NAME => strv(
            if gpu {
                "kreplay software GPU"
            } else {
                "kreplay software CPU"
            },
            64,
        ),
        HSA_AMD_AGENT_INFO_MAX_WAVES_PER_CU => u32v(gpu_or(32)),
        HSA_AMD_AGENT_INFO_NUM_SIMDS_PER_CU => u32v(gpu_or(4)),
        HSA_AMD_AGENT_INFO_NUM_SHADER_ENGINES => u32v(gpu_or(1)),
        HSA_AMD_AGENT_INFO_NUM_SHADER_ARRAYS_PER_SE => u32v(gpu_or(1)),
        HSA_AMD_AGENT_INFO_HDP_FLUSH if gpu => Ok(vec![0u8; size_of::<hsa_amd_hdp_flush_t>()]),
        HSA_AMD_AGENT_INFO_DOMAIN => u32v(0),
        HSA_AMD_AGENT_INFO_COOPERATIVE_QUEUES => boolv(gpu),
        HSA_AMD_AGENT_INFO_UUID => {
            let uuid = if gpu {
                format!(
                    "GPU-{:016x}",
                    0x6b72_5f00_0000_0000_u64 | u64::from(agent.node)
                )
            } else {
                "CPU-XX".to_string()
            };
            strv(&uuid, 21)
        }
        HSA_AMD_AGENT_INFO_ASIC_REVISION => u32v(0),
        HSA_AMD_AGENT_INFO_SVM_DIRECT_HOST_ACCESS => boolv(true),
        HSA_AMD_AGENT_INFO_COOPERATIVE_COMPUTE_UNIT_COUNT => u32v(gpu_or(compute_units)),
        _ => Err(HSA_STATUS_ERROR_INVALID_ARGUMENT),
    }
}

/// `hsa_amd_memory_pool_get_info` for pool `index`.
pub(crate) fn pool(rt: &Runtime, index: usize, attribute: hsa_amd_memory_pool_info_t) -> Info {
    let pool = &rt.topology.pools[index];
    let limit = usize::try_from(pool.budget.limit()).unwrap_or(usize::MAX);
    match attribute {
        // Every pool (kernarg ones included) lives in the global segment, as in ROCm.
        HSA_AMD_MEMORY_POOL_INFO_SEGMENT => u32v(HSA_AMD_SEGMENT_GLOBAL),
        HSA_AMD_MEMORY_POOL_INFO_GLOBAL_FLAGS => u32v(pool.kind.global_flags()),
        HSA_AMD_MEMORY_POOL_INFO_SIZE => usizev(limit),
        HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALLOWED => boolv(true),
        HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_GRANULE => usizev(ALLOC_GRANULE),
        HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALIGNMENT => usizev(ALLOC_GRANULE),
        HSA_AMD_MEMORY_POOL_INFO_ACCESSIBLE_BY_ALL => boolv(pool.kind.is_host()),
        HSA_AMD_MEMORY_POOL_INFO_ALLOC_MAX_SIZE => usizev(limit),
        _ => Err(HSA_STATUS_ERROR_INVALID_ARGUMENT),
    }
}

/// `hsa_region_get_info` for the region that mirrors pool `index`.
pub(crate) fn region(rt: &Runtime, index: usize, attribute: hsa_region_info_t) -> Info {
    let pool = &rt.topology.pools[index];
    let limit = usize::try_from(pool.budget.limit()).unwrap_or(usize::MAX);
    match attribute {
        HSA_REGION_INFO_SEGMENT => u32v(HSA_REGION_SEGMENT_GLOBAL),
        HSA_REGION_INFO_GLOBAL_FLAGS => u32v(pool.kind.global_flags()),
        HSA_REGION_INFO_SIZE | HSA_REGION_INFO_ALLOC_MAX_SIZE => usizev(limit),
        HSA_REGION_INFO_ALLOC_MAX_PRIVATE_WORKGROUP_SIZE => u32v(0),
        HSA_REGION_INFO_RUNTIME_ALLOC_ALLOWED => boolv(true),
        HSA_REGION_INFO_RUNTIME_ALLOC_GRANULE | HSA_REGION_INFO_RUNTIME_ALLOC_ALIGNMENT => {
            usizev(ALLOC_GRANULE)
        }
        HSA_AMD_REGION_INFO_HOST_ACCESSIBLE => boolv(true),
        HSA_AMD_REGION_INFO_BASE => usizev(0),
        HSA_AMD_REGION_INFO_BUS_WIDTH => u32v(64),
        HSA_AMD_REGION_INFO_MAX_CLOCK_FREQUENCY => u32v(1000),
        _ => Err(HSA_STATUS_ERROR_INVALID_ARGUMENT),
    }
}

/// The access an agent has to a pool: its own and host pools by default, other agents' device
/// memory after `hsa_amd_agents_allow_access`.
pub(crate) fn access(rt: &Runtime, agent: usize, pool: usize) -> u32 {
    let pool = &rt.topology.pools[pool];
    if pool.agent == agent || pool.kind.is_host() {
        HSA_AMD_MEMORY_POOL_ACCESS_ALLOWED_BY_DEFAULT
    } else {
        HSA_AMD_MEMORY_POOL_ACCESS_DISALLOWED_BY_DEFAULT
    }
}

/// `hsa_amd_agent_memory_pool_get_info`.
pub(crate) fn agent_pool(
    rt: &Runtime,
    agent: usize,
    pool: usize,
    attribute: hsa_amd_agent_memory_pool_info_t,
) -> Info {
    let hops = u32::from(rt.topology.pools[pool].agent != agent);
    match attribute {
        HSA_AMD_AGENT_MEMORY_POOL_INFO_ACCESS => u32v(access(rt, agent, pool)),
        HSA_AMD_AGENT_MEMORY_POOL_INFO_NUM_LINK_HOPS => u32v(hops),
        HSA_AMD_AGENT_MEMORY_POOL_INFO_LINK_INFO => {
            type L = hsa_amd_memory_pool_link_info_t;
            let mut bytes = vec![0u8; size_of::<L>() * hops as usize];
            if hops == 1 {
                let mut set = |offset: usize, value: &[u8]| {
                    bytes[offset..offset + value.len()].copy_from_slice(value);
                };
                set(offset_of!(L, min_latency), &1u32.to_ne_bytes());
                set(offset_of!(L, max_latency), &1u32.to_ne_bytes());
                set(offset_of!(L, min_bandwidth), &10_000u32.to_ne_bytes());
                set(offset_of!(L, max_bandwidth), &10_000u32.to_ne_bytes());
                set(offset_of!(L, atomic_support_32bit), &[1]);
                set(offset_of!(L, atomic_support_64bit), &[1]);
                set(offset_of!(L, coherent_support), &[1]);
                set(
                    offset_of!(L, link_type),
                    &HSA_AMD_LINK_INFO_TYPE_PCIE.to_ne_bytes(),
                );
                set(offset_of!(L, numa_distance), &20u32.to_ne_bytes());
            }
            Ok(bytes)
        }
        _ => Err(HSA_STATUS_ERROR_INVALID_ARGUMENT),
    }
}

/// `hsa_isa_get_info` / `hsa_isa_get_info_alt` for the GPU ISA.
pub(crate) fn isa(attribute: hsa_isa_info_t) -> Info {
    match attribute {
        HSA_ISA_INFO_NAME_LENGTH => u32v(ISA_NAME.len() as u32 + 1),
        HSA_ISA_INFO_NAME => strv(ISA_NAME, ISA_NAME.len() + 1),
        HSA_ISA_INFO_MACHINE_MODELS => Ok(vec![0, 1]),
        HSA_ISA_INFO_PROFILES => Ok(vec![1, 0]),
        HSA_ISA_INFO_DEFAULT_FLOAT_ROUNDING_MODES => Ok(vec![0, 0, 1]),
        HSA_ISA_INFO_BASE_PROFILE_DEFAULT_FLOAT_ROUNDING_MODES => Ok(vec![0, 0, 1]),
        HSA_ISA_INFO_FAST_F16_OPERATION => boolv(true),
        HSA_ISA_INFO_WORKGROUP_MAX_DIM => Ok([WORKGROUP_MAX_SIZE as u16; 3]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect()),
        HSA_ISA_INFO_WORKGROUP_MAX_SIZE => u32v(WORKGROUP_MAX_SIZE),
        HSA_ISA_INFO_GRID_MAX_DIM => u32s(&[u32::MAX; 3]),
        HSA_ISA_INFO_GRID_MAX_SIZE => u32v(u32::MAX),
        HSA_ISA_INFO_FBARRIER_MAX_SIZE => u32v(32),
        _ => Err(HSA_STATUS_ERROR_INVALID_ARGUMENT),
    }
}

/// `hsa_wavefront_get_info`.
pub(crate) fn wavefront(attribute: hsa_wavefront_info_t) -> Info {
    match attribute {
        HSA_WAVEFRONT_INFO_SIZE => u32v(WAVEFRONT_SIZE),
        _ => Err(HSA_STATUS_ERROR_INVALID_ARGUMENT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_nul_terminated_and_truncated_to_the_field() {
        assert_eq!(strv("abc", 5).unwrap(), b"abc\0\0");
        assert_eq!(strv("abcdef", 4).unwrap(), b"abc\0");
    }

    #[test]
    fn unknown_system_attributes_are_invalid_arguments() {
        assert_eq!(system(9999), Err(HSA_STATUS_ERROR_INVALID_ARGUMENT));
        assert_eq!(system(HSA_SYSTEM_INFO_VERSION_MAJOR), Ok(vec![1, 0]));
    }
}
