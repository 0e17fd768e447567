//! System and agent information through the API table.

mod common;

use common::*;
use hsa_sys::*;
use kreplay_softhsa::testing::Hsa;
use std::ffi::{CStr, c_void};

fn system_info<T: Default>(hsa: &Hsa, attribute: hsa_system_info_t) -> T {
    let mut value = T::default();
    let f = hsa.core().hsa_system_get_info_fn.unwrap();
    // SAFETY: table entry; `value` has the attribute's type.
    let status = unsafe { f(attribute, (&raw mut value).cast()) };
    assert_eq!(status, HSA_STATUS_SUCCESS);
    value
}

fn agent_info<T: Copy>(hsa: &Hsa, agent: hsa_agent_t, attribute: u32, mut value: T) -> T {
    let f = hsa.core().hsa_agent_get_info_fn.unwrap();
    // SAFETY: table entry; `value` has the attribute's type.
    let status = unsafe { f(agent, attribute, (&raw mut value).cast()) };
    assert_eq!(status, HSA_STATUS_SUCCESS, "attribute {attribute:#x}");
    value
}

fn text(bytes: &[u8]) -> String {
    CStr::from_bytes_until_nul(bytes)
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned()
}

#[test]
fn system_info_reports_version_clock_and_machine() {
    let (hsa, _session) = open();
    assert_eq!(system_info::<u16>(&hsa, HSA_SYSTEM_INFO_VERSION_MAJOR), 1);
    assert_eq!(system_info::<u16>(&hsa, HSA_SYSTEM_INFO_VERSION_MINOR), 1);
    assert_eq!(
        system_info::<u64>(&hsa, HSA_SYSTEM_INFO_TIMESTAMP_FREQUENCY),
        1_000_000_000
    );
    let t0 = system_info::<u64>(&hsa, HSA_SYSTEM_INFO_TIMESTAMP);
    let t1 = system_info::<u64>(&hsa, HSA_SYSTEM_INFO_TIMESTAMP);
    assert!(t0 > 0 && t1 >= t0, "monotonic, non-zero timestamps");
    assert_eq!(
        system_info::<u64>(&hsa, HSA_SYSTEM_INFO_SIGNAL_MAX_WAIT),
        u64::MAX
    );
    assert_eq!(
        system_info::<u32>(&hsa, HSA_SYSTEM_INFO_ENDIANNESS),
        HSA_ENDIANNESS_LITTLE
    );
    assert_eq!(
        system_info::<u32>(&hsa, HSA_SYSTEM_INFO_MACHINE_MODEL),
        HSA_MACHINE_MODEL_LARGE
    );
    let build = system_info::<usize>(&hsa, HSA_AMD_SYSTEM_INFO_BUILD_VERSION) as *const i8;
    // SAFETY: the attribute is a pointer to a static NUL-terminated string.
    let build = unsafe { CStr::from_ptr(build) };
    assert!(build.to_str().unwrap().contains("softhsa"));
}

#[test]
fn there_is_one_cpu_agent_and_two_gpu_agents_by_default() {
    let (hsa, _session) = open();
    let agents = hsa.agents().unwrap();
    assert_eq!(agents.len(), 3);
    let types: Vec<u32> = agents
        .iter()
        .map(|&a| hsa.device_type(a).unwrap())
        .collect();
    assert_eq!(
        types,
        vec![
            HSA_DEVICE_TYPE_CPU,
            HSA_DEVICE_TYPE_GPU,
            HSA_DEVICE_TYPE_GPU
        ]
    );
}

#[test]
fn gpu_agents_describe_a_kernel_dispatch_device() {
    let (hsa, _session) = open();
    let gpus = hsa.gpu_agents().unwrap();
    for (i, &gpu) in gpus.iter().enumerate() {
        assert!(!text(&agent_info(&hsa, gpu, HSA_AGENT_INFO_NAME, [0u8; 64])).is_empty());
        assert_eq!(
            text(&agent_info(
                &hsa,
                gpu,
                HSA_AGENT_INFO_VENDOR_NAME,
                [0u8; 64]
            )),
            "kreplay"
        );
        assert_eq!(
            agent_info(&hsa, gpu, HSA_AGENT_INFO_FEATURE, 0u32),
            HSA_AGENT_FEATURE_KERNEL_DISPATCH
        );
        assert_eq!(
            agent_info(&hsa, gpu, HSA_AGENT_INFO_PROFILE, 9u32),
            HSA_PROFILE_BASE
        );
        assert_eq!(
            agent_info(&hsa, gpu, HSA_AGENT_INFO_WAVEFRONT_SIZE, 0u32),
            64
        );
        assert_eq!(
            agent_info(&hsa, gpu, HSA_AGENT_INFO_WORKGROUP_MAX_SIZE, 0u32),
            1024
        );
        assert_eq!(
            agent_info(&hsa, gpu, HSA_AGENT_INFO_WORKGROUP_MAX_DIM, [0u16; 3]),
            [1024; 3]
        );
        let grid = agent_info(
            &hsa,
            gpu,
            HSA_AGENT_INFO_GRID_MAX_DIM,
            hsa_dim3_t::default(),
        );
        assert_eq!((grid.x, grid.y, grid.z), (u32::MAX, u32::MAX, u32::MAX));
        assert_eq!(
            agent_info(&hsa, gpu, HSA_AGENT_INFO_GRID_MAX_SIZE, 0u32),
            u32::MAX
        );
        let min = agent_info(&hsa, gpu, HSA_AGENT_INFO_QUEUE_MIN_SIZE, 0u32);
        let max = agent_info(&hsa, gpu, HSA_AGENT_INFO_QUEUE_MAX_SIZE, 0u32);
        assert!(min.is_power_of_two() && max.is_power_of_two() && min < max);
        assert!(agent_info(&hsa, gpu, HSA_AGENT_INFO_QUEUES_MAX, 0u32) >= 2);
        assert_eq!(
            agent_info(&hsa, gpu, HSA_AGENT_INFO_QUEUE_TYPE, 9u32),
            HSA_QUEUE_TYPE_MULTI
        );
        assert_eq!(
            agent_info(&hsa, gpu, HSA_AGENT_INFO_NODE, 0u32),
            i as u32 + 1
        );
        assert!(agent_info(&hsa, gpu, HSA_AMD_AGENT_INFO_COMPUTE_UNIT_COUNT, 0u32) >= 2);
        assert_ne!(agent_info(&hsa, gpu, HSA_AMD_AGENT_INFO_CHIP_ID, 0u32), 0);
        assert!(
            !text(&agent_info(
                &hsa,
                gpu,
                HSA_AMD_AGENT_INFO_PRODUCT_NAME,
                [0u8; 64]
            ))
            .is_empty()
        );
        let uuid = text(&agent_info(&hsa, gpu, HSA_AMD_AGENT_INFO_UUID, [0u8; 21]));
        assert!(uuid.starts_with("GPU-") && uuid.len() == 20, "{uuid}");
    }
    let uuids: Vec<String> = gpus
        .iter()
        .map(|&g| text(&agent_info(&hsa, g, HSA_AMD_AGENT_INFO_UUID, [0u8; 21])))
        .collect();
    assert_ne!(uuids[0], uuids[1], "each GPU has its own UUID");
    let cpu = hsa.cpu_agent().unwrap();
    assert_eq!(agent_info(&hsa, cpu, HSA_AGENT_INFO_QUEUES_MAX, 9u32), 0);
    assert_eq!(agent_info(&hsa, cpu, HSA_AGENT_INFO_NODE, 9u32), 0);
}

unsafe extern "C" fn stop_at_second(_agent: hsa_agent_t, data: *mut c_void) -> hsa_status_t {
    // SAFETY: `data` is the counter passed below.
    let seen = unsafe { &mut *data.cast::<u32>() };
    *seen += 1;
    if *seen == 2 {
        HSA_STATUS_INFO_BREAK
    } else {
        HSA_STATUS_SUCCESS
    }
}

#[test]
fn a_callback_can_stop_the_agent_walk_with_info_break() {
    let (hsa, _session) = open();
    let f = hsa.core().hsa_iterate_agents_fn.unwrap();
    let mut seen = 0u32;
    // SAFETY: table entry; `seen` outlives the call.
    let status = unsafe { f(Some(stop_at_second), (&raw mut seen).cast()) };
    assert_eq!(status, HSA_STATUS_INFO_BREAK);
    assert_eq!(seen, 2, "the walk stopped at the callback that asked");
}

#[test]
fn status_strings_name_the_status() {
    let (hsa, _session) = open();
    let f = hsa.core().hsa_status_string_fn.unwrap();
    let mut s: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: table entry; the result is a static string.
    unsafe {
        assert_eq!(
            f(HSA_STATUS_ERROR_INVALID_SIGNAL, &mut s),
            HSA_STATUS_SUCCESS
        );
        assert!(
            CStr::from_ptr(s)
                .to_str()
                .unwrap()
                .starts_with("HSA_STATUS_ERROR_INVALID_SIGNAL")
        );
        assert_eq!(f(0xffff, &mut s), HSA_STATUS_ERROR_INVALID_ARGUMENT);
    }
}

#[test]
fn gpu_agents_expose_their_isa_by_name() {
    let (hsa, _session) = open();
    let c = *hsa.core();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let isa = agent_info(&hsa, gpu, HSA_AGENT_INFO_ISA, hsa_isa_t { handle: 0 });
    let mut len = 0u32;
    // SAFETY: table entries; out values have the attributes' types.
    unsafe {
        assert_eq!(
            c.hsa_isa_get_info_alt_fn.unwrap()(
                isa,
                HSA_ISA_INFO_NAME_LENGTH,
                (&raw mut len).cast()
            ),
            HSA_STATUS_SUCCESS
        );
        let mut name = vec![0u8; len as usize];
        assert_eq!(
            c.hsa_isa_get_info_alt_fn.unwrap()(isa, HSA_ISA_INFO_NAME, name.as_mut_ptr().cast()),
            HSA_STATUS_SUCCESS
        );
        let mut same = hsa_isa_t { handle: 0 };
        assert_eq!(
            c.hsa_isa_from_name_fn.unwrap()(name.as_ptr().cast(), &mut same),
            HSA_STATUS_SUCCESS
        );
        assert_eq!(same.handle, isa.handle);
    }
}
