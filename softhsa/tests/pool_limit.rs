//! A configured runtime: one GPU with a tiny device-memory budget. Its own process, so the
//! configuration does not collide with the default one other test files use.

mod common;

use common::*;
use hsa_sys::*;
use kreplay_softhsa::testing::{Hsa, PoolKind, Session};
use kreplay_softhsa::{SoftHsaConfig, configure};
use std::sync::{Mutex, MutexGuard};

const VRAM: u64 = 64 * 1024;

fn config() -> SoftHsaConfig {
    SoftHsaConfig {
        gpu_agents: 1,
        vram_bytes_per_agent: VRAM,
        host_bytes: 1 << 20,
        worker_threads: 1,
        ..SoftHsaConfig::default()
    }
}

/// The budget is shared by every test of this process: run them one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn setup() -> (MutexGuard<'static, ()>, Hsa, Session) {
    let guard = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    configure(config()).unwrap();
    let (hsa, session) = open();
    (guard, hsa, session)
}

#[test]
fn hsa_init_builds_the_configured_topology() {
    let (_serial, hsa, _session) = setup();
    assert_eq!(hsa.gpu_agents().unwrap().len(), 1);
    let gpu = hsa.gpu_agents().unwrap()[0];
    let mut size = 0usize;
    let f = hsa.amd().hsa_amd_memory_pool_get_info_fn.unwrap();
    // SAFETY: table entry; SIZE is a size_t.
    let status = unsafe {
        f(
            hsa.coarse_pool(gpu).unwrap(),
            HSA_AMD_MEMORY_POOL_INFO_SIZE,
            (&raw mut size).cast(),
        )
    };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    assert_eq!(size as u64, VRAM);
    let mut units = 0u32;
    let info = hsa.core().hsa_agent_get_info_fn.unwrap();
    // SAFETY: table entry; COMPUTE_UNIT_COUNT is a u32.
    let status = unsafe {
        info(
            gpu,
            HSA_AMD_AGENT_INFO_COMPUTE_UNIT_COUNT,
            (&raw mut units).cast(),
        )
    };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    assert_eq!(units, 2, "one worker thread plus the queue's own processor");
}

#[test]
fn allocations_beyond_the_device_budget_fail_until_memory_is_freed() {
    let (_serial, hsa, _session) = setup();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let coarse = hsa.coarse_pool(gpu).unwrap();
    let fine = hsa.pool(gpu, PoolKind::Fine).unwrap();
    let a = hsa.allocate(coarse, 32 * 1024).unwrap();
    let b = hsa.allocate(fine, 30 * 1024).unwrap();
    assert_eq!(
        hsa.allocate(coarse, 4096),
        Err(HSA_STATUS_ERROR_OUT_OF_RESOURCES),
        "32 KiB + 30 KiB (rounded to 32 KiB) fill the shared 64 KiB"
    );
    assert_eq!(
        hsa.allocate(fine, 1),
        Err(HSA_STATUS_ERROR_OUT_OF_RESOURCES)
    );
    hsa.free(b).unwrap();
    let c = hsa
        .allocate(coarse, 32 * 1024)
        .expect("room again after the free");
    hsa.free(a).unwrap();
    hsa.free(c).unwrap();
}

#[test]
fn configure_is_refused_while_initialized_with_another_configuration() {
    let (_serial, _hsa, _session) = setup();
    let other = SoftHsaConfig {
        gpu_agents: 3,
        ..config()
    };
    let refused = configure(other).unwrap_err();
    assert!(refused.contains("initialized"), "{refused}");
    assert!(
        configure(config()).is_ok(),
        "the active configuration may be set again"
    );
}
