//! Contexts, the callback tracing service rules, record delivery and the PASS ENTER toggles, all
//! through the exported C functions where the C ABI has one.

mod common;

use std::ffi::{CStr, c_int, c_void};
use std::sync::Mutex;

use kreplay::abi::{
    CallbackFn, CallbackKind, CallbackPhase, CallbackRecord, ContextHandle, DeclineReason,
    KernelDispatchData, KernelDispatchInfo, KernelDispatchOperation, KernelReplayData,
    KernelReplayOperation, Status, UserData,
};
use kreplay::api::*;
use kreplay::services::{self, TraceEvent};
use kreplay::{lifecycle, replay};
use kreplay_ctxmask::{ContextId, ContextRegistry};

/// What one callback invocation saw.
#[derive(Clone, Copy, Debug)]
struct Seen {
    record: CallbackRecord,
    user_data_in: u64,
}

/// Records every callback; the tool's `callback_data` points at it.
#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<Seen>>,
}

impl Recorder {
    fn data(&self) -> *mut c_void {
        self as *const Recorder as *mut c_void
    }

    fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

/// Records the call, then stores `correlation_id * 10 + phase` into the user data.
unsafe extern "C" fn record_cb(
    record: CallbackRecord,
    user_data: *mut UserData,
    data: *mut c_void,
) {
    // SAFETY: every test passes a live `Recorder` as callback data.
    let recorder = unsafe { &*(data as *const Recorder) };
    // SAFETY: kreplay passes valid user data storage.
    let user_data = unsafe { &mut *user_data };
    recorder.seen.lock().unwrap().push(Seen {
        record,
        user_data_in: user_data.bits(),
    });
    user_data.value = record.correlation_id * 10 + u64::from(record.phase.0);
}

const CB: Option<CallbackFn> = Some(record_cb);

fn new_context() -> ContextHandle {
    let mut ctx = ContextHandle::default();
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { kreplay_create_context(&mut ctx) }, Status::SUCCESS);
    ctx
}

fn configure(
    ctx: ContextHandle,
    kind: CallbackKind,
    operations: Option<&[u32]>,
    callback: Option<CallbackFn>,
    data: *mut c_void,
) -> Status {
    let (ptr, len) = operations.map_or((std::ptr::null(), 0), |ops| (ops.as_ptr(), ops.len()));
    // SAFETY: `ptr`/`len` describe a live slice or are NULL/0.
    unsafe { kreplay_configure_callback_tracing_service(ctx, kind, ptr, len, callback, data) }
}

fn is_active(ctx: ContextHandle) -> Result<bool, Status> {
    let mut flag: c_int = -1;
    // SAFETY: valid out-pointer.
    match unsafe { kreplay_context_is_active(ctx, &mut flag) } {
        Status::SUCCESS => Ok(flag == 1),
        status => Err(status),
    }
}

fn event(operation: u32, phase: CallbackPhase, correlation_id: u64) -> TraceEvent {
    TraceEvent {
        operation,
        phase,
        correlation_id,
        decline_reason: DeclineReason::NONE,
        payload: std::ptr::null_mut(),
    }
}

// ---------------------------------------------------------------------------------------------
// Contexts
// ---------------------------------------------------------------------------------------------

#[test]
fn create_context_rejects_a_null_out_pointer() {
    // SAFETY: NULL is allowed and must be rejected.
    let status = unsafe { kreplay_create_context(std::ptr::null_mut()) };
    assert_eq!(status, Status::ERROR_INVALID_ARGUMENT);
}

#[test]
fn created_contexts_are_distinct_nonzero_and_stopped() {
    let a = new_context();
    let b = new_context();
    assert_ne!(a.handle, 0);
    assert_ne!(b.handle, 0);
    assert_ne!(a, b);
    assert_eq!(is_active(a), Ok(false));
    assert_eq!(is_active(b), Ok(false));
}

#[test]
fn start_and_stop_change_the_global_state_that_is_active_reports() {
    let ctx = new_context();
    assert_eq!(kreplay_start_context(ctx), Status::SUCCESS);
    assert_eq!(is_active(ctx), Ok(true));
    assert_eq!(
        kreplay_start_context(ctx),
        Status::SUCCESS,
        "starting twice is fine"
    );
    assert_eq!(kreplay_stop_context(ctx), Status::SUCCESS);
    assert_eq!(is_active(ctx), Ok(false));
    assert_eq!(
        ContextRegistry::global().is_started(ctx.into()),
        Ok(false),
        "the C calls drive the process-wide registry"
    );
}

#[test]
fn unknown_contexts_are_not_found() {
    let known = new_context();
    for handle in [0, known.handle + 1_000_000, u64::MAX] {
        let ctx = ContextHandle { handle };
        assert_eq!(kreplay_start_context(ctx), Status::ERROR_CONTEXT_NOT_FOUND);
        assert_eq!(kreplay_stop_context(ctx), Status::ERROR_CONTEXT_NOT_FOUND);
        assert_eq!(is_active(ctx), Err(Status::ERROR_CONTEXT_NOT_FOUND));
    }
}

#[test]
fn context_is_active_rejects_a_null_status_pointer() {
    let ctx = new_context();
    // SAFETY: NULL is allowed and must be rejected.
    let status = unsafe { kreplay_context_is_active(ctx, std::ptr::null_mut()) };
    assert_eq!(status, Status::ERROR_INVALID_ARGUMENT);
}

// ---------------------------------------------------------------------------------------------
// Service configuration rules
// ---------------------------------------------------------------------------------------------

#[test]
fn configuring_a_kind_once_per_context_succeeds_and_twice_is_already_configured() {
    let _serial = common::serial();
    kreplay::reset_for_tests();
    let recorder = Recorder::default();
    let ctx = new_context();
    let dispatch = CallbackKind::KERNEL_DISPATCH;
    assert_eq!(
        configure(ctx, dispatch, None, CB, recorder.data()),
        Status::SUCCESS
    );
    assert_eq!(
        configure(ctx, dispatch, None, CB, recorder.data()),
        Status::ERROR_SERVICE_ALREADY_CONFIGURED
    );
    let ops = [KernelDispatchOperation::COMPLETE.0];
    assert_eq!(
        configure(ctx, dispatch, Some(&ops), CB, recorder.data()),
        Status::ERROR_SERVICE_ALREADY_CONFIGURED,
        "a different filter does not make it a different service"
    );
    // Another kind on the same context, and the same kind on other contexts, are fine.
    assert_eq!(
        configure(ctx, CallbackKind::KERNEL_REPLAY, None, CB, recorder.data()),
        Status::SUCCESS
    );
    let other = new_context();
    assert_eq!(
        configure(other, dispatch, None, CB, recorder.data()),
        Status::SUCCESS
    );
    let tracers = services::dispatch_tracers();
    assert_eq!(
        tracers.iter().map(|s| s.context).collect::<Vec<_>>(),
        vec![ContextId::from(ctx), ContextId::from(other)]
    );
    kreplay::reset_for_tests();
}

#[test]
fn kernel_replay_has_a_single_owner_in_the_process() {
    let _serial = common::serial();
    kreplay::reset_for_tests();
    let recorder = Recorder::default();
    let owner = new_context();
    let second = new_context();
    assert!(!services::replay_configured());
    assert!(services::replay_owner().is_none());
    assert_eq!(
        configure(
            owner,
            CallbackKind::KERNEL_REPLAY,
            None,
            CB,
            recorder.data()
        ),
        Status::SUCCESS
    );
    assert!(services::replay_configured());
    assert_eq!(
        configure(
            second,
            CallbackKind::KERNEL_REPLAY,
            None,
            CB,
            recorder.data()
        ),
        Status::ERROR_SERVICE_ALREADY_CONFIGURED
    );
    let owner_service = services::replay_owner().expect("owner");
    assert_eq!(owner_service.context, ContextId::from(owner));
    assert_eq!(owner_service.callback_data, recorder.data());
    assert_eq!(
        services::table().of_kind(CallbackKind::KERNEL_REPLAY).len(),
        1
    );
    kreplay::reset_for_tests();
    assert!(!services::replay_configured());
}

#[test]
fn invalid_arguments_are_rejected_and_leave_no_service() {
    let _serial = common::serial();
    kreplay::reset_for_tests();
    let recorder = Recorder::default();
    let ctx = new_context();
    let replay = CallbackKind::KERNEL_REPLAY;
    let invalid = Status::ERROR_INVALID_ARGUMENT;

    assert_eq!(
        configure(ctx, replay, None, None, recorder.data()),
        invalid,
        "NULL callback"
    );
    for kind in [CallbackKind::NONE, CallbackKind::LAST, CallbackKind(1000)] {
        assert_eq!(
            configure(ctx, kind, None, CB, recorder.data()),
            invalid,
            "{kind:?}"
        );
    }
    // SAFETY: NULL with a non-zero count must be rejected without reading.
    let null_with_count = unsafe {
        kreplay_configure_callback_tracing_service(
            ctx,
            replay,
            std::ptr::null(),
            3,
            CB,
            recorder.data(),
        )
    };
    assert_eq!(null_with_count, invalid);
    for bad in [
        KernelReplayOperation::NONE.0,
        KernelReplayOperation::LAST.0,
        63,
        64,
        u32::MAX,
    ] {
        let ops = [KernelReplayOperation::PASS.0, bad];
        assert_eq!(
            configure(ctx, replay, Some(&ops), CB, recorder.data()),
            invalid,
            "op {bad}"
        );
    }
    assert!(services::table().is_empty(), "nothing was configured");
    assert!(!services::replay_configured());

    // The same context still accepts a valid configuration afterwards.
    assert_eq!(
        configure(ctx, replay, None, CB, recorder.data()),
        Status::SUCCESS
    );
    kreplay::reset_for_tests();
}

#[test]
fn unknown_context_is_not_found_when_configuring() {
    let _serial = common::serial();
    kreplay::reset_for_tests();
    let recorder = Recorder::default();
    for handle in [0, u64::MAX] {
        assert_eq!(
            configure(
                ContextHandle { handle },
                CallbackKind::KERNEL_DISPATCH,
                None,
                CB,
                recorder.data()
            ),
            Status::ERROR_CONTEXT_NOT_FOUND
        );
    }
    assert!(services::table().is_empty());
}

#[test]
fn zero_count_means_all_operations_and_a_list_means_only_those() {
    let _serial = common::serial();
    kreplay::reset_for_tests();
    let recorder = Recorder::default();
    let all = new_context();
    let some = new_context();
    assert_eq!(
        configure(all, CallbackKind::KERNEL_REPLAY, None, CB, recorder.data()),
        Status::SUCCESS
    );
    let ops = [KernelDispatchOperation::COMPLETE.0];
    assert_eq!(
        configure(
            some,
            CallbackKind::KERNEL_DISPATCH,
            Some(&ops),
            CB,
            recorder.data()
        ),
        Status::SUCCESS
    );
    let owner = services::replay_owner().unwrap();
    for op in 1..KernelReplayOperation::LAST.0 {
        assert!(owner.wants(op), "all operations include {op}");
    }
    let tracer = services::dispatch_tracers()[0];
    assert!(tracer.wants(KernelDispatchOperation::COMPLETE.0));
    assert!(!tracer.wants(KernelDispatchOperation::ENQUEUE.0));
    kreplay::reset_for_tests();
}

#[test]
fn configuration_is_locked_after_tool_initialization() {
    let _serial = common::serial();
    kreplay::reset_for_tests();
    let recorder = Recorder::default();
    let ctx = new_context();
    assert!(!services::configuration_locked());
    lifecycle::initialize_tools_with(&lifecycle::ToolSearch::default()).unwrap();
    assert!(services::configuration_locked());
    assert_eq!(
        configure(
            ctx,
            CallbackKind::KERNEL_DISPATCH,
            None,
            CB,
            recorder.data()
        ),
        Status::ERROR_CONFIGURATION_LOCKED
    );
    // Locked wins over other errors: the caller learns that configuring is over.
    assert_eq!(
        configure(ctx, CallbackKind::NONE, None, None, recorder.data()),
        Status::ERROR_CONFIGURATION_LOCKED
    );
    assert!(services::table().is_empty());
    // Contexts can still be created and started.
    let late = new_context();
    assert_eq!(kreplay_start_context(late), Status::SUCCESS);
    kreplay::reset_for_tests();
    assert_eq!(
        configure(
            ctx,
            CallbackKind::KERNEL_DISPATCH,
            None,
            CB,
            recorder.data()
        ),
        Status::SUCCESS,
        "the test reset reopens configuration"
    );
    kreplay::reset_for_tests();
}

// ---------------------------------------------------------------------------------------------
// Delivery
// ---------------------------------------------------------------------------------------------

#[test]
fn delivery_requires_a_started_context_and_a_wanted_operation() {
    let _serial = common::serial();
    kreplay::reset_for_tests();
    let recorder = Recorder::default();
    let ctx = new_context();
    let ops = [KernelDispatchOperation::COMPLETE.0];
    assert_eq!(
        configure(
            ctx,
            CallbackKind::KERNEL_DISPATCH,
            Some(&ops),
            CB,
            recorder.data()
        ),
        Status::SUCCESS
    );
    let service = services::dispatch_tracers()[0];
    let complete = event(KernelDispatchOperation::COMPLETE.0, CallbackPhase::NONE, 7);
    let enqueue = event(KernelDispatchOperation::ENQUEUE.0, CallbackPhase::ENTER, 7);
    let mut user_data = UserData::ZERO;

    // SAFETY: no payload is read by the recorder.
    unsafe {
        assert!(
            !service.deliver(&complete, &mut user_data),
            "stopped context"
        );
        assert_eq!(kreplay_start_context(ctx), Status::SUCCESS);
        assert!(service.deliver(&complete, &mut user_data));
        assert!(!service.deliver(&enqueue, &mut user_data), "filtered out");
        assert_eq!(kreplay_stop_context(ctx), Status::SUCCESS);
        assert!(!service.deliver(&complete, &mut user_data), "stopped again");
        assert!(!service.deliver_if_started(&complete, &mut user_data));
    }
    assert_eq!(recorder.take().len(), 1);
    kreplay::reset_for_tests();
}

#[test]
fn records_carry_context_kind_operation_phase_payload_and_thread() {
    let _serial = common::serial();
    kreplay::reset_for_tests();
    let recorder = Recorder::default();
    let ctx = new_context();
    assert_eq!(
        configure(
            ctx,
            CallbackKind::KERNEL_DISPATCH,
            None,
            CB,
            recorder.data()
        ),
        Status::SUCCESS
    );
    assert_eq!(kreplay_start_context(ctx), Status::SUCCESS);
    let service = services::dispatch_tracers()[0];

    let mut payload = KernelDispatchData::new(KernelDispatchInfo {
        dispatch_id: 42,
        ..KernelDispatchInfo::default()
    });
    payload.replay_pass = 3;
    let correlation = services::next_correlation_id();
    let mut enter = event(
        KernelDispatchOperation::ENQUEUE.0,
        CallbackPhase::ENTER,
        correlation,
    );
    enter.payload = (&mut payload as *mut KernelDispatchData).cast();
    let mut exit = enter;
    exit.phase = CallbackPhase::EXIT;

    let mut user_data = UserData::ZERO;
    // SAFETY: the payload is a live KernelDispatchData, as documented for KERNEL_DISPATCH.
    unsafe {
        assert!(service.deliver(&enter, &mut user_data));
        assert!(service.deliver(&exit, &mut user_data));
    }
    let seen = recorder.take();
    assert_eq!(seen.len(), 2);
    let first = seen[0].record;
    assert_eq!(first.context_id, ctx);
    assert_eq!(first.kind, CallbackKind::KERNEL_DISPATCH);
    assert_eq!(first.operation, KernelDispatchOperation::ENQUEUE.0);
    assert_eq!(first.phase, CallbackPhase::ENTER);
    assert_eq!(first.correlation_id, correlation);
    assert_eq!(first.payload, enter.payload);
    assert_eq!(first.thread_id, services::current_thread_id());
    assert_ne!(first.thread_id, 0);
    assert_eq!(seen[1].record.phase, CallbackPhase::EXIT);
    // What the tool wrote at ENTER it sees again at EXIT.
    assert_eq!(seen[0].user_data_in, 0);
    assert_eq!(seen[1].user_data_in, correlation * 10 + 1);
    assert_eq!(user_data.bits(), correlation * 10 + 2);
    assert_ne!(
        services::next_correlation_id(),
        correlation,
        "correlation ids are fresh"
    );
    kreplay::reset_for_tests();
}

#[test]
fn records_on_another_thread_carry_that_threads_id() {
    let main_id = services::current_thread_id();
    let other_id = std::thread::spawn(services::current_thread_id)
        .join()
        .unwrap();
    assert_ne!(main_id, other_id);
    assert_eq!(main_id, services::current_thread_id(), "stable per thread");
}

#[test]
fn masked_off_context_gets_no_dispatch_record_but_replay_owner_still_does() {
    let _serial = common::serial();
    kreplay::reset_for_tests();
    let tracer_rec = Recorder::default();
    let owner_rec = Recorder::default();
    let owner = new_context();
    let tracer = new_context();
    assert_eq!(
        configure(
            owner,
            CallbackKind::KERNEL_REPLAY,
            None,
            CB,
            owner_rec.data()
        ),
        Status::SUCCESS
    );
    assert_eq!(
        configure(
            tracer,
            CallbackKind::KERNEL_DISPATCH,
            None,
            CB,
            tracer_rec.data()
        ),
        Status::SUCCESS
    );
    assert_eq!(kreplay_start_context(owner), Status::SUCCESS);
    assert_eq!(kreplay_start_context(tracer), Status::SUCCESS);
    let owner_service = services::replay_owner().unwrap();
    let tracer_service = services::dispatch_tracers()[0];

    let complete = event(KernelDispatchOperation::COMPLETE.0, CallbackPhase::NONE, 1);
    let pass_exit = event(KernelReplayOperation::PASS.0, CallbackPhase::EXIT, 1);
    let mut payload = KernelReplayData::new(KernelDispatchInfo::default());
    let mut user_data = UserData::ZERO;

    let registry = ContextRegistry::global();
    let mask = registry.begin_replay();
    {
        let _pass_enter = mask.arm();
        replay::arm_toggles(&mut payload);
        // SAFETY: the library's own toggle functions.
        unsafe {
            assert_eq!(
                payload.replay_stop_context.unwrap()(tracer),
                Status::SUCCESS
            );
            assert_eq!(payload.replay_stop_context.unwrap()(owner), Status::SUCCESS);
        }
        replay::disarm_toggles(&mut payload);
    }
    // SAFETY: the recorder reads no payload.
    unsafe {
        assert!(
            !tracer_service.deliver(&complete, &mut user_data),
            "masked off for the pass"
        );
        assert!(
            !owner_service.deliver(&pass_exit, &mut user_data),
            "mask applies to deliver"
        );
        assert!(
            owner_service.deliver_if_started(&pass_exit, &mut user_data),
            "the replay owner still sees its own replay"
        );
    }
    assert_eq!(
        is_active(tracer),
        Ok(true),
        "masks never touch global state"
    );
    drop(mask);
    // SAFETY: as above.
    unsafe {
        assert!(
            tracer_service.deliver(&complete, &mut user_data),
            "mask reset after the loop"
        );
    }
    assert_eq!(tracer_rec.take().len(), 1);
    assert_eq!(owner_rec.take().len(), 1);
    assert!(payload.replay_start_context.is_none() && payload.replay_stop_context.is_none());
    kreplay::reset_for_tests();
}

// ---------------------------------------------------------------------------------------------
// PASS ENTER toggles
// ---------------------------------------------------------------------------------------------

#[test]
fn toggles_outside_pass_enter_are_context_errors_and_change_nothing() {
    let ctx = new_context();
    assert_eq!(kreplay_start_context(ctx), Status::SUCCESS);
    assert_eq!(
        replay::pass_stop_context(ctx),
        Status::ERROR_CONTEXT_ERROR,
        "no loop at all"
    );
    let registry = ContextRegistry::global();
    let mask = registry.begin_replay();
    assert_eq!(
        replay::pass_stop_context(ctx),
        Status::ERROR_CONTEXT_ERROR,
        "loop not armed"
    );
    assert_eq!(replay::pass_start_context(ctx), Status::ERROR_CONTEXT_ERROR);
    assert!(mask.is_enabled(ctx.into()));
    assert!(registry.is_active(ctx.into()));
    drop(mask);
    assert_eq!(is_active(ctx), Ok(true));
}

#[test]
fn toggling_a_context_not_started_at_replay_begin_is_not_started() {
    let stopped = new_context();
    let started_later = new_context();
    let registry = ContextRegistry::global();
    let mask = registry.begin_replay();
    assert_eq!(kreplay_start_context(started_later), Status::SUCCESS);
    {
        let _pass_enter = mask.arm();
        for ctx in [stopped, started_later, ContextHandle { handle: u64::MAX }] {
            assert_eq!(
                replay::pass_start_context(ctx),
                Status::ERROR_CONTEXT_NOT_STARTED,
                "{ctx:?}"
            );
            assert_eq!(
                replay::pass_stop_context(ctx),
                Status::ERROR_CONTEXT_NOT_STARTED,
                "{ctx:?}"
            );
        }
    }
    drop(mask);
    assert_eq!(
        is_active(stopped),
        Ok(false),
        "toggles never start a context"
    );
}

#[test]
fn toggles_are_sticky_across_passes_and_reset_when_the_loop_ends() {
    let ctx = new_context();
    assert_eq!(kreplay_start_context(ctx), Status::SUCCESS);
    let id = ContextId::from(ctx);
    let registry = ContextRegistry::global();
    let mask = registry.begin_replay();
    // Pass 0: mask off.
    {
        let _pass_enter = mask.arm();
        assert_eq!(replay::pass_stop_context(ctx), Status::SUCCESS);
    }
    assert!(!registry.is_active(id));
    // Pass 1: not re-programmed, still off.
    {
        let _pass_enter = mask.arm();
    }
    assert!(!registry.is_active(id));
    // Pass 2: back on.
    {
        let _pass_enter = mask.arm();
        assert_eq!(replay::pass_start_context(ctx), Status::SUCCESS);
    }
    assert!(registry.is_active(id));
    {
        let _pass_enter = mask.arm();
        assert_eq!(replay::pass_stop_context(ctx), Status::SUCCESS);
    }
    drop(mask);
    assert!(
        registry.is_active(id),
        "reset when the dispatch's replay ends"
    );
    assert_eq!(is_active(ctx), Ok(true));
}

#[test]
fn toggle_outcomes_map_onto_spec_status_codes() {
    use kreplay_ctxmask::ToggleError;
    assert_eq!(replay::toggle_status(Ok(())), Status::SUCCESS);
    assert_eq!(
        replay::toggle_status(Err(ToggleError::NotArmed)),
        Status::ERROR_CONTEXT_ERROR
    );
    assert_eq!(
        replay::toggle_status(Err(ToggleError::NotStarted)),
        Status::ERROR_CONTEXT_NOT_STARTED
    );
}

// ---------------------------------------------------------------------------------------------
// Strings and version
// ---------------------------------------------------------------------------------------------

fn c_str(ptr: *const std::ffi::c_char) -> Option<String> {
    // SAFETY: kreplay returns NULL or a static NUL-terminated string.
    (!ptr.is_null()).then(|| unsafe { CStr::from_ptr(ptr) }.to_str().unwrap().to_owned())
}

#[test]
fn every_status_has_its_own_name_and_description() {
    let mut names = std::collections::HashSet::new();
    let mut descriptions = std::collections::HashSet::new();
    for &(suffix, status) in Status::VALUES {
        if status == Status::LAST {
            continue;
        }
        let name = c_str(kreplay_get_status_name(status)).unwrap();
        assert_eq!(name, format!("KREPLAY_STATUS_{suffix}"));
        let description = c_str(kreplay_get_status_string(status)).unwrap();
        assert!(!description.is_empty());
        assert!(names.insert(name));
        assert!(descriptions.insert(description));
    }
    for unknown in [Status::LAST, Status(-1), Status(i32::MAX)] {
        assert_eq!(
            c_str(kreplay_get_status_name(unknown)).unwrap(),
            "KREPLAY_STATUS_UNKNOWN"
        );
        assert_eq!(
            c_str(kreplay_get_status_string(unknown)).unwrap(),
            "unknown kreplay status"
        );
    }
    assert_eq!(
        Status::ERROR_CONTEXT_NOT_FOUND.to_string(),
        "context not found (KREPLAY_STATUS_ERROR_CONTEXT_NOT_FOUND)"
    );
}

#[test]
fn decline_reasons_have_the_spec_names() {
    let expected = [
        (DeclineReason::UNTRACKED_MEMORY, "untracked_memory"),
        (DeclineReason::FOOTPRINT_BUDGET, "footprint_budget"),
        (DeclineReason::SNAPSHOT_FAILED, "snapshot_failed"),
        (DeclineReason::QUEUE_DRAIN_STUCK, "queue_drain_stuck"),
        (DeclineReason::AGENT_DRAIN_STUCK, "agent_drain_stuck"),
        (DeclineReason::PASS_DRAIN_STUCK, "pass_drain_stuck"),
        (DeclineReason::REENTRANT_DISPATCH, "reentrant_dispatch"),
        (DeclineReason::INVALID_PASS_COUNT, "invalid_pass_count"),
        (DeclineReason::BATCH_OR_GRAPH, "batch_or_graph"),
    ];
    for (reason, name) in expected {
        assert_eq!(
            c_str(kreplay_get_decline_reason_string(reason)).unwrap(),
            name
        );
        assert_eq!(reason.to_string(), name);
    }
    assert_eq!(DeclineReason::LAST.0 as usize, expected.len() + 1);
    assert_eq!(
        c_str(kreplay_get_decline_reason_string(DeclineReason::NONE)).unwrap(),
        "none"
    );
    assert_eq!(
        c_str(kreplay_get_decline_reason_string(DeclineReason(99))).unwrap(),
        "unknown"
    );
}

#[test]
fn kind_and_operation_names_cover_known_values_only() {
    assert_eq!(
        c_str(kreplay_get_callback_tracing_kind_name(
            CallbackKind::KERNEL_DISPATCH
        ))
        .unwrap(),
        "KERNEL_DISPATCH"
    );
    assert_eq!(
        c_str(kreplay_get_callback_tracing_kind_name(CallbackKind::LAST)),
        None
    );
    let names: Vec<_> = (0..KernelReplayOperation::LAST.0)
        .map(|op| {
            c_str(kreplay_get_callback_tracing_operation_name(
                CallbackKind::KERNEL_REPLAY,
                op,
            ))
            .unwrap()
        })
        .collect();
    assert_eq!(names, ["NONE", "CONFIG", "PASS", "SNAPSHOT", "RESTORE"]);
    assert_eq!(
        c_str(kreplay_get_callback_tracing_operation_name(
            CallbackKind::KERNEL_REPLAY,
            KernelReplayOperation::LAST.0
        )),
        None
    );
    assert_eq!(
        c_str(kreplay_get_callback_tracing_operation_name(
            CallbackKind::KERNEL_DISPATCH,
            KernelDispatchOperation::COMPLETE.0
        ))
        .unwrap(),
        "COMPLETE"
    );
    assert_eq!(
        c_str(kreplay_get_callback_tracing_operation_name(
            CallbackKind::NONE,
            1
        )),
        None
    );
}

#[test]
fn version_matches_the_crate_and_null_pointers_are_skipped() {
    let (mut major, mut minor, mut patch) = (99, 99, 99);
    // SAFETY: valid out-pointers, then NULLs (allowed).
    unsafe {
        assert_eq!(
            kreplay_get_version(&mut major, &mut minor, &mut patch),
            Status::SUCCESS
        );
        assert_eq!(
            kreplay_get_version(
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut()
            ),
            Status::SUCCESS
        );
    }
    let crate_version = env!("CARGO_PKG_VERSION");
    assert_eq!(format!("{major}.{minor}.{patch}"), crate_version);
    assert_eq!(
        kreplay::abi::VERSION_STRING.to_str().unwrap(),
        crate_version
    );
}

#[test]
fn racing_kernel_replay_configurations_leave_exactly_one_owner() {
    let _serial = common::serial();
    kreplay::reset_for_tests();
    let contexts: Vec<ContextHandle> = (0..8).map(|_| new_context()).collect();
    let barrier = std::sync::Barrier::new(contexts.len());
    let statuses: Vec<Status> = std::thread::scope(|scope| {
        let handles: Vec<_> = contexts
            .iter()
            .map(|&ctx| {
                let barrier = &barrier;
                scope.spawn(move || {
                    barrier.wait();
                    configure(
                        ctx,
                        CallbackKind::KERNEL_REPLAY,
                        None,
                        CB,
                        std::ptr::null_mut(),
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let winners: Vec<_> = contexts
        .iter()
        .zip(&statuses)
        .filter(|(_, status)| **status == Status::SUCCESS)
        .map(|(ctx, _)| ContextId::from(*ctx))
        .collect();
    assert_eq!(winners.len(), 1, "{statuses:?}");
    assert!(
        statuses
            .iter()
            .all(|s| *s == Status::SUCCESS || *s == Status::ERROR_SERVICE_ALREADY_CONFIGURED)
    );
    assert_eq!(services::replay_owner().unwrap().context, winners[0]);
    kreplay::reset_for_tests();
}
