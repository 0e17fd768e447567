//! Executables: host code objects with kernels and module-scope variables, loaded per agent and
//! looked up through the HSA executable API.

mod common;

use common::*;
use hsa_sys::*;
use kreplay_softhsa::testing::Dispatch;
use kreplay_softhsa::{CodeObject, WorkGroup, register_kernel};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};

#[repr(C)]
#[derive(Clone, Copy)]
struct CounterArgs {
    counter: u64,
}

/// `*counter += 1`, once per dispatch.
fn bump_counter(group: &WorkGroup) {
    // SAFETY: dispatches of this kernel carry a `CounterArgs` block.
    let args: CounterArgs = unsafe { group.kernargs() };
    // SAFETY: the argument is the address of a live, aligned u32 variable.
    unsafe { &*(args.counter as *const AtomicU32) }.fetch_add(1, Ordering::SeqCst);
}

fn code() -> CodeObject {
    let kernel = register_kernel("executables_bump_counter", bump_counter);
    CodeObject::new()
        .kernel("executables_bump_counter", kernel, 8)
        .variable("counter", &41u32.to_ne_bytes())
        .readonly_variable("limit", &7u64.to_ne_bytes())
}

#[test]
fn a_kernel_increments_a_module_variable_found_by_symbol_lookup() {
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let exe = hsa.load_executable(gpu, &code()).unwrap();
    let counter = hsa.symbol(exe, gpu, "counter").unwrap();
    let addr = hsa
        .symbol_u64(counter, HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_ADDRESS)
        .unwrap();
    let kernel = hsa.symbol(exe, gpu, "executables_bump_counter").unwrap();
    let object = hsa
        .symbol_u64(kernel, HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_OBJECT)
        .unwrap();
    let mut args = CounterArgs { counter: addr };
    let queue = hsa.queue_create(gpu, 64).unwrap();
    let done = hsa.signal_create(2).unwrap();
    for _ in 0..2 {
        // SAFETY: a live queue; the kernarg block outlives the dispatch (waited for below).
        unsafe {
            hsa.dispatch(
                queue,
                &Dispatch::linear(object, 1, 1, (&raw mut args).cast::<c_void>(), done),
            )
        };
    }
    assert!(hsa.wait_zero(done, PROMPT));
    // SAFETY: the variable is a live u32 in the executable's segment.
    let value = unsafe { *(addr as *const u32) };
    assert_eq!(value, 43, "initialized to 41, two increments");
    // The runtime knows the variable's memory: the agent's coarse-grained memory.
    let mut info = hsa_amd_pointer_info_t {
        size: size_of::<hsa_amd_pointer_info_t>() as u32,
        ..Default::default()
    };
    // SAFETY: table entry; `info` is a live local with its size set.
    let st = unsafe {
        hsa.amd().hsa_amd_pointer_info_fn.unwrap()(
            addr as *const c_void,
            &mut info,
            None,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    assert_eq!(st, HSA_STATUS_SUCCESS);
    assert_eq!(info.type_, HSA_EXT_POINTER_TYPE_HSA);
    assert_eq!(info.agentOwner.handle, gpu.handle);
    assert_ne!(
        info.global_flags & HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED,
        0
    );
    // SAFETY: created above.
    unsafe { hsa.queue_destroy(queue) }.unwrap();
    hsa.destroy_executable(exe).unwrap();
}

/// Per the HSA specification: symbol kinds, sizes, const-ness, segments, iteration per agent,
/// lookups without an agent (no program symbols), frozen executables, errors.
#[test]
fn symbols_describe_themselves_as_the_hsa_specification_says() {
    let (hsa, _session) = open();
    let gpus = hsa.gpu_agents().unwrap();
    let core = *hsa.core();
    let exe = hsa.load_executable(gpus[0], &code()).unwrap();
    let info_u32 = |sym, attr| {
        let mut v = 0u32;
        // SAFETY: table entry; a 4-byte attribute into a live local.
        let st = unsafe {
            core.hsa_executable_symbol_get_info_fn.unwrap()(sym, attr, (&raw mut v).cast())
        };
        (st, v)
    };
    let info_bool = |sym, attr| {
        let mut v = false;
        // SAFETY: table entry; a bool attribute into a live local.
        let st = unsafe {
            core.hsa_executable_symbol_get_info_fn.unwrap()(sym, attr, (&raw mut v).cast())
        };
        assert_eq!(st, HSA_STATUS_SUCCESS);
        v
    };
    let counter = hsa.symbol(exe, gpus[0], "counter").unwrap();
    let limit = hsa.symbol(exe, gpus[0], "limit").unwrap();
    let kernel = hsa
        .symbol(exe, gpus[0], "executables_bump_counter")
        .unwrap();
    assert_eq!(
        info_u32(counter, HSA_EXECUTABLE_SYMBOL_INFO_TYPE),
        (HSA_STATUS_SUCCESS, HSA_SYMBOL_KIND_VARIABLE)
    );
    assert_eq!(
        info_u32(kernel, HSA_EXECUTABLE_SYMBOL_INFO_TYPE),
        (HSA_STATUS_SUCCESS, HSA_SYMBOL_KIND_KERNEL)
    );
    assert_eq!(
        info_u32(counter, HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_SIZE),
        (HSA_STATUS_SUCCESS, 4)
    );
    assert_eq!(
        info_u32(limit, HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_SIZE),
        (HSA_STATUS_SUCCESS, 8)
    );
    assert_eq!(
        info_u32(counter, HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_SEGMENT),
        (HSA_STATUS_SUCCESS, HSA_VARIABLE_SEGMENT_GLOBAL)
    );
    assert_eq!(
        info_u32(limit, HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_SEGMENT),
        (HSA_STATUS_SUCCESS, HSA_VARIABLE_SEGMENT_READONLY)
    );
    assert_eq!(
        info_u32(counter, HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_ALLOCATION),
        (HSA_STATUS_SUCCESS, HSA_VARIABLE_ALLOCATION_AGENT)
    );
    assert!(!info_bool(
        counter,
        HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_IS_CONST
    ));
    assert!(info_bool(
        limit,
        HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_IS_CONST
    ));
    assert_eq!(
        info_u32(
            kernel,
            HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_SIZE
        ),
        (HSA_STATUS_SUCCESS, 8)
    );
    assert_eq!(
        info_u32(kernel, HSA_EXECUTABLE_SYMBOL_INFO_NAME_LENGTH),
        (HSA_STATUS_SUCCESS, 24)
    );
    assert_eq!(
        info_u32(kernel, HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_SIZE).0,
        HSA_STATUS_ERROR_INVALID_ARGUMENT,
        "a kernel has no variable size"
    );
    assert_eq!(
        info_u32(
            counter,
            HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_SIZE
        )
        .0,
        HSA_STATUS_ERROR_INVALID_ARGUMENT
    );

    // Iteration: three symbols on GPU 0, none on GPU 1; a callback's status stops the walk.
    unsafe extern "C" fn count(
        _: hsa_executable_t,
        _: hsa_agent_t,
        _: hsa_executable_symbol_t,
        data: *mut c_void,
    ) -> hsa_status_t {
        // SAFETY: `data` is the counter below.
        unsafe { *data.cast::<u32>() += 1 };
        HSA_STATUS_INFO_BREAK
    }
    unsafe extern "C" fn count_all(
        _: hsa_executable_t,
        _: hsa_agent_t,
        _: hsa_executable_symbol_t,
        data: *mut c_void,
    ) -> hsa_status_t {
        // SAFETY: `data` is the counter below.
        unsafe { *data.cast::<u32>() += 1 };
        HSA_STATUS_SUCCESS
    }
    for (agent, callback, expected_status, expected) in [
        (
            gpus[0],
            count_all as unsafe extern "C" fn(_, _, _, _) -> _,
            HSA_STATUS_SUCCESS,
            3,
        ),
        (gpus[1], count_all, HSA_STATUS_SUCCESS, 0),
        (gpus[0], count, HSA_STATUS_INFO_BREAK, 1),
    ] {
        let mut n = 0u32;
        // SAFETY: table entry; the callback's data is a live local.
        let st = unsafe {
            core.hsa_executable_iterate_agent_symbols_fn.unwrap()(
                exe,
                agent,
                Some(callback),
                (&raw mut n).cast(),
            )
        };
        assert_eq!((st, n), (expected_status, expected));
    }
    let name = c"counter";
    let mut sym = hsa_executable_symbol_t { handle: 0 };
    // SAFETY: table entries with live arguments.
    unsafe {
        assert_eq!(
            core.hsa_executable_get_symbol_by_name_fn.unwrap()(
                exe,
                name.as_ptr(),
                std::ptr::null(),
                &mut sym
            ),
            HSA_STATUS_ERROR_INVALID_SYMBOL_NAME,
            "agent variables are not program symbols"
        );
        assert_eq!(
            core.hsa_executable_get_symbol_by_name_fn.unwrap()(
                exe,
                name.as_ptr(),
                &gpus[1],
                &mut sym
            ),
            HSA_STATUS_ERROR_INVALID_SYMBOL_NAME,
            "not loaded on GPU 1"
        );
        assert_eq!(
            core.hsa_executable_freeze_fn.unwrap()(exe, std::ptr::null()),
            HSA_STATUS_ERROR_FROZEN_EXECUTABLE
        );
        let mut state = 0u32;
        assert_eq!(
            core.hsa_executable_get_info_fn.unwrap()(
                exe,
                HSA_EXECUTABLE_INFO_STATE,
                (&raw mut state).cast()
            ),
            HSA_STATUS_SUCCESS
        );
        assert_eq!(state, HSA_EXECUTABLE_STATE_FROZEN);
        let mut reader = hsa_code_object_reader_t { handle: 0 };
        let junk = [0u8; 16];
        assert_eq!(
            core.hsa_code_object_reader_create_from_memory_fn.unwrap()(
                junk.as_ptr().cast(),
                junk.len(),
                &mut reader
            ),
            HSA_STATUS_ERROR_INVALID_CODE_OBJECT
        );
    }
    // A frozen executable takes no more code objects.
    let bytes = CodeObject::new().variable("more", &[1]).to_bytes();
    let mut reader = hsa_code_object_reader_t { handle: 0 };
    // SAFETY: table entries with live arguments.
    unsafe {
        assert_eq!(
            core.hsa_code_object_reader_create_from_memory_fn.unwrap()(
                bytes.as_ptr().cast(),
                bytes.len(),
                &mut reader
            ),
            HSA_STATUS_SUCCESS
        );
        assert_eq!(
            core.hsa_executable_load_agent_code_object_fn.unwrap()(
                exe,
                gpus[0],
                reader,
                std::ptr::null(),
                std::ptr::null_mut()
            ),
            HSA_STATUS_ERROR_FROZEN_EXECUTABLE
        );
        assert_eq!(
            core.hsa_code_object_reader_destroy_fn.unwrap()(reader),
            HSA_STATUS_SUCCESS
        );
    }
    hsa.destroy_executable(exe).unwrap();
    assert_eq!(
        hsa.destroy_executable(exe),
        Err(HSA_STATUS_ERROR_INVALID_EXECUTABLE)
    );
}

/// Runs kernel symbol `kernel` of `exe` once on `gpu` and returns the variable's value.
fn bump_once(
    hsa: &kreplay_softhsa::testing::Hsa,
    gpu: hsa_agent_t,
    exe: hsa_executable_t,
    kernel: &str,
) -> u32 {
    let counter = hsa.symbol(exe, gpu, "counter").unwrap();
    let addr = hsa
        .symbol_u64(counter, HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_ADDRESS)
        .unwrap();
    let kernel = hsa.symbol(exe, gpu, kernel).unwrap();
    let object = hsa
        .symbol_u64(kernel, HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_OBJECT)
        .unwrap();
    let mut args = CounterArgs { counter: addr };
    let queue = hsa.queue_create(gpu, 64).unwrap();
    let done = hsa.signal_create(1).unwrap();
    // SAFETY: a live queue; the kernarg block outlives the dispatch (waited for below).
    unsafe {
        hsa.dispatch(
            queue,
            &Dispatch::linear(object, 1, 1, (&raw mut args).cast::<c_void>(), done),
        )
    };
    assert!(hsa.wait_zero(done, PROMPT));
    // SAFETY: the variable is a live u32 in the executable's segment.
    unsafe { *(addr as *const u32) }
}

#[test]
fn the_elf_form_loads_from_memory_and_from_a_file_with_its_metadata() {
    let (hsa, _session) = open();
    let gpu = hsa.gpu_agents().unwrap()[0];
    let elf = code()
        .hidden_args("executables_bump_counter", &["hidden_printf_buffer"])
        .to_elf();
    // What a tool reads from it: the kernel and its hidden argument.
    let kernels = kreplay_codeobj::kernels(&elf).unwrap().unwrap();
    assert_eq!(kernels.len(), 1);
    assert_eq!(kernels[0].name, "executables_bump_counter");
    assert_eq!(kernels[0].symbol, "executables_bump_counter.kd");
    assert!(kernels[0].printf && !kernels[0].hostcall && !kernels[0].heap);

    let exe = hsa.load_executable_bytes(gpu, &elf).unwrap();
    // The kernel's symbol is its kernel descriptor's, as on ROCm.
    assert!(hsa.symbol(exe, gpu, "executables_bump_counter").is_err());
    let kd = "executables_bump_counter.kd";
    assert_eq!(
        bump_once(&hsa, gpu, exe, kd),
        42,
        "initialized to 41, one increment"
    );

    let path = std::env::temp_dir().join(format!("softhsa-elf-{}.co", std::process::id()));
    std::fs::write(&path, &elf).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let exe = hsa.load_executable_file(gpu, &file).unwrap();
    assert_eq!(
        bump_once(&hsa, gpu, exe, kd),
        42,
        "a fresh executable, its own variable"
    );

    // A truncated ELF is no code object.
    assert!(
        hsa.load_executable_bytes(gpu, &elf[..elf.len() / 2])
            .is_err()
    );
}
