//! Small wrappers that call an [`HsaApiTable`] (softhsa's own, or a copy in which a tool replaced
//! some entries), so tests and demos read like the HSA program they are. Everything here goes
//! through the table's function pointers; nothing reaches into softhsa directly, but for
//! [`wrap_hardware_writes`], which shows what no HSA call can: the packets an intercept
//! queue's handlers write into its hardware queue.
//!
//! ```
//! use kreplay_softhsa::testing::Hsa;
//! let hsa = Hsa::softhsa();
//! let _session = hsa.init().unwrap();
//! let gpu = hsa.gpu_agents().unwrap()[0];
//! let pool = hsa.coarse_pool(gpu).unwrap();
//! let buffer = hsa.allocate(pool, 4096).unwrap();
//! hsa.free(buffer).unwrap();
//! ```

use hsa_sys::*;
use std::ffi::c_void;
use std::mem::size_of;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

/// A result carrying the failing HSA status.
pub type HsaResult<T> = Result<T, hsa_status_t>;

fn check(status: hsa_status_t) -> HsaResult<()> {
    if status == HSA_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(status)
    }
}

/// Copies of the core and AMD tables of an [`HsaApiTable`], with safe-to-call wrappers.
#[derive(Clone, Copy)]
pub struct Hsa {
    core: CoreApiTable,
    amd: AmdExtTable,
    image: ImageExtTable,
    batch_copy: Option<BatchCopy>,
}

/// `hsa_amd_memory_async_batch_copy` (ROCm 7 tables).
pub type BatchCopy = unsafe extern "C" fn(
    copy_ops: *const hsa_sys::layouts::hsa_amd_memory_copy_op_t,
    num_copy_ops: u32,
    num_dep_signals: u32,
    dep_signals: *const hsa_signal_t,
) -> hsa_status_t;

/// Unwraps a table entry; every entry the wrappers use must be present.
macro_rules! entry {
    ($table:expr, $name:ident) => {
        $table
            .$name
            .expect(concat!("the API table has no ", stringify!($name)))
    };
}

/// Calls an entry that returns a status; `Err` for anything but success.
macro_rules! call {
    ($table:expr, $name:ident($($arg:expr),* $(,)?)) => {{
        let f = entry!($table, $name);
        // SAFETY: the table's entries follow the HSA signatures (asserted by `Hsa::from_table`)
        // and every pointer argument points to live storage of the declared type.
        check(unsafe { f($($arg),*) })
    }};
}

/// Which of an agent's memory pools to pick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolKind {
    /// Coarse-grained global memory (device memory).
    Coarse,
    /// Fine-grained global memory that is not a kernarg pool.
    Fine,
    /// A kernarg pool.
    Kernarg,
}

impl PoolKind {
    fn matches(self, flags: u32) -> bool {
        let kernarg = flags & HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_KERNARG_INIT != 0;
        match self {
            PoolKind::Coarse => flags & HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED != 0,
            PoolKind::Fine => flags & HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_FINE_GRAINED != 0 && !kernarg,
            PoolKind::Kernarg => kernarg,
        }
    }
}

/// A kernel dispatch to submit with [`Hsa::dispatch`].
#[derive(Debug, Clone, Copy)]
pub struct Dispatch {
    /// From [`crate::register_kernel`].
    pub kernel_object: u64,
    /// Work-items per dimension.
    pub grid: [u32; 3],
    /// Work-group size per dimension.
    pub workgroup: [u16; 3],
    /// The kernel argument block (may be null).
    pub kernarg: *mut c_void,
    /// Decremented when the dispatch completes (handle 0 for none).
    pub completion: hsa_signal_t,
    /// Set the packet's barrier bit.
    pub barrier: bool,
}

impl Dispatch {
    /// A one-dimensional dispatch of `items` work-items in groups of `group`, barrier bit set.
    pub fn linear(
        kernel_object: u64,
        items: u32,
        group: u16,
        kernarg: *mut c_void,
        completion: hsa_signal_t,
    ) -> Self {
        Self {
            kernel_object,
            grid: [items, 1, 1],
            workgroup: [group, 1, 1],
            kernarg,
            completion,
            barrier: true,
        }
    }
}

/// A packet header of `packet_type` with system-scope acquire and release fences.
pub fn packet_header(packet_type: hsa_packet_type_t, barrier: bool) -> u16 {
    let header = (packet_type << HSA_PACKET_HEADER_TYPE)
        | (u32::from(barrier) << HSA_PACKET_HEADER_BARRIER)
        | (HSA_FENCE_SCOPE_SYSTEM << HSA_PACKET_HEADER_SCACQUIRE_FENCE_SCOPE)
        | (HSA_FENCE_SCOPE_SYSTEM << HSA_PACKET_HEADER_SCRELEASE_FENCE_SCOPE);
    header as u16
}

/// The kernel dispatch packet for `d`, header included.
pub fn dispatch_packet(d: &Dispatch) -> hsa_kernel_dispatch_packet_t {
    let dims = if d.grid[2] > 1 || d.workgroup[2] > 1 {
        3
    } else if d.grid[1] > 1 || d.workgroup[1] > 1 {
        2
    } else {
        1
    };
    hsa_kernel_dispatch_packet_t {
        header: packet_header(HSA_PACKET_TYPE_KERNEL_DISPATCH, d.barrier),
        setup: dims << HSA_KERNEL_DISPATCH_PACKET_SETUP_DIMENSIONS,
        workgroup_size_x: d.workgroup[0],
        workgroup_size_y: d.workgroup[1],
        workgroup_size_z: d.workgroup[2],
        reserved0: 0,
        grid_size_x: d.grid[0],
        grid_size_y: d.grid[1],
        grid_size_z: d.grid[2],
        private_segment_size: 0,
        group_segment_size: 0,
        kernel_object: d.kernel_object,
        kernarg_address: d.kernarg,
        reserved2: 0,
        completion_signal: d.completion,
    }
}

/// A barrier-AND packet waiting for up to five `deps`.
pub fn barrier_and_packet(
    deps: &[hsa_signal_t],
    completion: hsa_signal_t,
    barrier: bool,
) -> hsa_barrier_and_packet_t {
    assert!(
        deps.len() <= 5,
        "a barrier-AND packet holds at most five dependencies"
    );
    let mut dep_signal = [hsa_signal_t { handle: 0 }; 5];
    dep_signal[..deps.len()].copy_from_slice(deps);
    hsa_barrier_and_packet_t {
        header: packet_header(HSA_PACKET_TYPE_BARRIER_AND, barrier),
        reserved0: 0,
        reserved1: 0,
        dep_signal,
        reserved2: 0,
        completion_signal: completion,
    }
}

/// Keeps the runtime initialized; `hsa_shut_down` runs on drop.
pub struct Session {
    shut_down: unsafe extern "C" fn() -> hsa_status_t,
}

impl Drop for Session {
    fn drop(&mut self) {
        // SAFETY: the table's hsa_shut_down, balancing the hsa_init of `Hsa::init`.
        let _ = unsafe { (self.shut_down)() };
    }
}

impl Hsa {
    /// Wrappers around softhsa's own table.
    pub fn softhsa() -> Self {
        // SAFETY: softhsa's table is fully populated with entries of the right signatures.
        unsafe { Self::from_table(crate::api_table()) }
    }

    /// Wrappers around any table.
    ///
    /// # Safety
    /// `table.core_` and `table.amd_ext_` must point to valid tables, and `table.image_ext_` be
    /// null or point to one, whose entries have the HSA signatures and stay callable while the
    /// returned value is used.
    pub unsafe fn from_table(table: &HsaApiTable) -> Self {
        // SAFETY: the caller guarantees the pointers are valid tables; the AMD extension
        // table is read by entry name in whichever order its version says it has.
        unsafe {
            Self {
                core: *table.core_,
                amd: hsa_sys::layouts::read_amd_ext_as_v1(table.amd_ext_),
                image: if table.image_ext_.is_null() {
                    ImageExtTable::default()
                } else {
                    *table.image_ext_
                },
                batch_copy: batch_copy_of(table.amd_ext_),
            }
        }
    }

    /// `hsa_amd_memory_async_batch_copy`, where the table has it (a ROCm 7 layout).
    pub fn batch_copy(&self) -> Option<BatchCopy> {
        self.batch_copy
    }

    /// The copied core table.
    pub fn core(&self) -> &CoreApiTable {
        &self.core
    }

    /// The copied AMD extension table.
    pub fn amd(&self) -> &AmdExtTable {
        &self.amd
    }

    /// The copied image extension table (all entries null when the table has none).
    pub fn image(&self) -> &ImageExtTable {
        &self.image
    }

    /// `hsa_init`; the returned session calls `hsa_shut_down` when dropped.
    pub fn init(&self) -> HsaResult<Session> {
        call!(self.core, hsa_init_fn())?;
        Ok(Session {
            shut_down: entry!(self.core, hsa_shut_down_fn),
        })
    }

    /// Every agent, in `hsa_iterate_agents` order.
    pub fn agents(&self) -> HsaResult<Vec<hsa_agent_t>> {
        unsafe extern "C" fn collect(agent: hsa_agent_t, data: *mut c_void) -> hsa_status_t {
            // SAFETY: `data` is the Vec passed below, alive for the iteration.
            unsafe { (*data.cast::<Vec<hsa_agent_t>>()).push(agent) };
            HSA_STATUS_SUCCESS
        }
        let mut agents: Vec<hsa_agent_t> = Vec::new();
        call!(
            self.core,
            hsa_iterate_agents_fn(Some(collect), std::ptr::from_mut(&mut agents).cast())
        )?;
        Ok(agents)
    }

    /// `HSA_AGENT_INFO_DEVICE` of an agent.
    pub fn device_type(&self, agent: hsa_agent_t) -> HsaResult<hsa_device_type_t> {
        let mut device: hsa_device_type_t = 0;
        call!(
            self.core,
            hsa_agent_get_info_fn(
                agent,
                HSA_AGENT_INFO_DEVICE,
                std::ptr::from_mut(&mut device).cast()
            )
        )?;
        Ok(device)
    }

    /// The GPU agents.
    pub fn gpu_agents(&self) -> HsaResult<Vec<hsa_agent_t>> {
        let mut gpus = Vec::new();
        for agent in self.agents()? {
            if self.device_type(agent)? == HSA_DEVICE_TYPE_GPU {
                gpus.push(agent);
            }
        }
        Ok(gpus)
    }

    /// The CPU agent.
    pub fn cpu_agent(&self) -> HsaResult<hsa_agent_t> {
        for agent in self.agents()? {
            if self.device_type(agent)? == HSA_DEVICE_TYPE_CPU {
                return Ok(agent);
            }
        }
        Err(HSA_STATUS_ERROR_INVALID_AGENT)
    }

    /// An agent's memory pools, in iteration order.
    pub fn pools(&self, agent: hsa_agent_t) -> HsaResult<Vec<hsa_amd_memory_pool_t>> {
        unsafe extern "C" fn collect(
            pool: hsa_amd_memory_pool_t,
            data: *mut c_void,
        ) -> hsa_status_t {
            // SAFETY: `data` is the Vec passed below, alive for the iteration.
            unsafe { (*data.cast::<Vec<hsa_amd_memory_pool_t>>()).push(pool) };
            HSA_STATUS_SUCCESS
        }
        let mut pools: Vec<hsa_amd_memory_pool_t> = Vec::new();
        call!(
            self.amd,
            hsa_amd_agent_iterate_memory_pools_fn(
                agent,
                Some(collect),
                std::ptr::from_mut(&mut pools).cast()
            )
        )?;
        Ok(pools)
    }

    /// `HSA_AMD_MEMORY_POOL_INFO_GLOBAL_FLAGS` of a pool.
    pub fn pool_flags(&self, pool: hsa_amd_memory_pool_t) -> HsaResult<u32> {
        let mut flags = 0u32;
        call!(
            self.amd,
            hsa_amd_memory_pool_get_info_fn(
                pool,
                HSA_AMD_MEMORY_POOL_INFO_GLOBAL_FLAGS,
                std::ptr::from_mut(&mut flags).cast()
            )
        )?;
        Ok(flags)
    }

    /// The first pool of `agent` of the given kind.
    pub fn pool(&self, agent: hsa_agent_t, kind: PoolKind) -> HsaResult<hsa_amd_memory_pool_t> {
        for pool in self.pools(agent)? {
            if kind.matches(self.pool_flags(pool)?) {
                return Ok(pool);
            }
        }
        Err(HSA_STATUS_ERROR_INVALID_MEMORY_POOL)
    }

    /// The agent's coarse-grained pool.
    pub fn coarse_pool(&self, agent: hsa_agent_t) -> HsaResult<hsa_amd_memory_pool_t> {
        self.pool(agent, PoolKind::Coarse)
    }

    /// `hsa_amd_memory_pool_allocate`.
    pub fn allocate(&self, pool: hsa_amd_memory_pool_t, size: usize) -> HsaResult<*mut u8> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        call!(
            self.amd,
            hsa_amd_memory_pool_allocate_fn(pool, size, 0, &mut ptr)
        )?;
        Ok(ptr.cast())
    }

    /// `hsa_amd_agents_allow_access`: `agents` may reach the allocation at `ptr`.
    pub fn allow_access(&self, agents: &[hsa_agent_t], ptr: *const u8) -> HsaResult<()> {
        call!(
            self.amd,
            hsa_amd_agents_allow_access_fn(
                agents.len() as u32,
                agents.as_ptr(),
                std::ptr::null(),
                ptr.cast()
            )
        )
    }

    /// `hsa_amd_memory_pool_free`.
    pub fn free(&self, ptr: *mut u8) -> HsaResult<()> {
        call!(self.amd, hsa_amd_memory_pool_free_fn(ptr.cast()))
    }

    /// `hsa_signal_create` with no consumer list.
    pub fn signal_create(&self, initial: hsa_signal_value_t) -> HsaResult<hsa_signal_t> {
        let mut signal = hsa_signal_t { handle: 0 };
        call!(
            self.core,
            hsa_signal_create_fn(initial, 0, std::ptr::null(), &mut signal)
        )?;
        Ok(signal)
    }

    /// `hsa_signal_destroy`.
    pub fn signal_destroy(&self, signal: hsa_signal_t) -> HsaResult<()> {
        call!(self.core, hsa_signal_destroy_fn(signal))
    }

    /// `hsa_signal_load_scacquire`.
    pub fn signal_load(&self, signal: hsa_signal_t) -> hsa_signal_value_t {
        let f = entry!(self.core, hsa_signal_load_scacquire_fn);
        // SAFETY: a table entry with the HSA signature; signals are passed by value.
        unsafe { f(signal) }
    }

    /// `hsa_signal_store_screlease`.
    pub fn signal_store(&self, signal: hsa_signal_t, value: hsa_signal_value_t) {
        let f = entry!(self.core, hsa_signal_store_screlease_fn);
        // SAFETY: a table entry with the HSA signature; signals are passed by value.
        unsafe { f(signal, value) }
    }

    /// `hsa_signal_wait_scacquire` (blocked wait state) with a timeout; returns the last value.
    pub fn signal_wait(
        &self,
        signal: hsa_signal_t,
        condition: hsa_signal_condition_t,
        value: hsa_signal_value_t,
        timeout: Duration,
    ) -> hsa_signal_value_t {
        let ticks = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX - 1);
        let f = entry!(self.core, hsa_signal_wait_scacquire_fn);
        // SAFETY: a table entry with the HSA signature; all arguments are plain values.
        unsafe { f(signal, condition, value, ticks, HSA_WAIT_STATE_BLOCKED) }
    }

    /// Waits until `signal` is 0; `true` if it got there before `timeout`.
    pub fn wait_zero(&self, signal: hsa_signal_t, timeout: Duration) -> bool {
        self.signal_wait(signal, HSA_SIGNAL_CONDITION_EQ, 0, timeout) == 0
    }

    /// `hsa_queue_create` of a multi-producer queue with no error callback.
    pub fn queue_create(&self, agent: hsa_agent_t, size: u32) -> HsaResult<*mut hsa_queue_t> {
        let mut queue: *mut hsa_queue_t = std::ptr::null_mut();
        call!(
            self.core,
            hsa_queue_create_fn(
                agent,
                size,
                HSA_QUEUE_TYPE_MULTI,
                None,
                std::ptr::null_mut(),
                u32::MAX,
                u32::MAX,
                &mut queue
            )
        )?;
        Ok(queue)
    }

    /// `hsa_amd_queue_intercept_create` of a multi-producer queue with no error callback.
    pub fn intercept_queue_create(
        &self,
        agent: hsa_agent_t,
        size: u32,
    ) -> HsaResult<*mut hsa_queue_t> {
        let mut queue: *mut hsa_queue_t = std::ptr::null_mut();
        call!(
            self.amd,
            hsa_amd_queue_intercept_create_fn(
                agent,
                size,
                HSA_QUEUE_TYPE_MULTI,
                None,
                std::ptr::null_mut(),
                u32::MAX,
                u32::MAX,
                &mut queue
            )
        )?;
        Ok(queue)
    }

    /// `hsa_queue_destroy`.
    ///
    /// # Safety
    /// `queue` must be a queue created through this table and not destroyed yet.
    pub unsafe fn queue_destroy(&self, queue: *mut hsa_queue_t) -> HsaResult<()> {
        call!(self.core, hsa_queue_destroy_fn(queue))
    }

    /// Submits one 64-byte AQL packet the way HSA producers do: reserve a slot with
    /// `hsa_queue_add_write_index_scacq_screl`, wait while the ring is full, write the body, store
    /// the header last with release order, then ring the doorbell with the packet id. Returns
    /// the packet id.
    ///
    /// # Safety
    /// `queue` must be a live queue of this table's runtime, and `P` a 64-byte AQL packet type
    /// whose first two bytes are the header.
    pub unsafe fn submit<P: Copy>(&self, queue: *mut hsa_queue_t, packet: &P) -> u64 {
        assert_eq!(size_of::<P>(), AQL_PACKET_SIZE, "AQL packets are 64 bytes");
        let add = entry!(self.core, hsa_queue_add_write_index_scacq_screl_fn);
        let load_read = entry!(self.core, hsa_queue_load_read_index_scacquire_fn);
        let store = entry!(self.core, hsa_signal_store_screlease_fn);
        // SAFETY: the caller guarantees `queue` is live; its fields are read-only for producers.
        let (base, size, doorbell) = unsafe {
            (
                (*queue).base_address.cast::<u8>(),
                u64::from((*queue).size),
                (*queue).doorbell_signal,
            )
        };
        // SAFETY: table entries with the HSA signatures, on a live queue.
        let index = unsafe { add(queue, 1) };
        // SAFETY: as above.
        while index >= unsafe { load_read(queue) } + size {
            std::thread::yield_now();
        }
        let slot = (index % size) as usize * AQL_PACKET_SIZE;
        let bytes = std::ptr::from_ref(packet).cast::<u8>();
        // SAFETY: the slot is ours (reserved above and free once the read index passed it);
        // the body is copied first, then the header is published with one atomic release store.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.add(2), base.add(slot + 2), AQL_PACKET_SIZE - 2);
            let header = bytes.cast::<u16>().read_unaligned();
            (*base.add(slot).cast::<AtomicU16>()).store(header, Ordering::Release);
            store(doorbell, index as hsa_signal_value_t);
        }
        index
    }

    /// Loads `code` for `agent` into a new executable and freezes it (`hsa_executable_create_alt`,
    /// `hsa_code_object_reader_create_from_memory`, `hsa_executable_load_agent_code_object`,
    /// `hsa_executable_freeze`; the reader is destroyed afterwards).
    pub fn load_executable(
        &self,
        agent: hsa_agent_t,
        code: &crate::CodeObject,
    ) -> HsaResult<hsa_executable_t> {
        self.load_executable_bytes(agent, &code.to_bytes())
    }

    /// [`load_executable`](Self::load_executable) from code object bytes in either form
    /// (`CodeObject::to_bytes` or `CodeObject::to_elf`), read from memory
    /// (`hsa_code_object_reader_create_from_memory`).
    pub fn load_executable_bytes(
        &self,
        agent: hsa_agent_t,
        bytes: &[u8],
    ) -> HsaResult<hsa_executable_t> {
        let mut reader = hsa_code_object_reader_t { handle: 0 };
        call!(
            self.core,
            hsa_code_object_reader_create_from_memory_fn(
                bytes.as_ptr().cast(),
                bytes.len(),
                &mut reader
            )
        )?;
        self.load_reader(agent, reader)
    }

    /// [`load_executable`](Self::load_executable) from a code object file, read by the runtime
    /// (`hsa_code_object_reader_create_from_file`).
    pub fn load_executable_file(
        &self,
        agent: hsa_agent_t,
        file: &std::fs::File,
    ) -> HsaResult<hsa_executable_t> {
        use std::os::fd::AsRawFd;
        let mut reader = hsa_code_object_reader_t { handle: 0 };
        call!(
            self.core,
            hsa_code_object_reader_create_from_file_fn(file.as_raw_fd(), &mut reader)
        )?;
        self.load_reader(agent, reader)
    }

    /// Creates an executable, loads `reader`'s code object on `agent`, freezes it and destroys
    /// the reader.
    fn load_reader(
        &self,
        agent: hsa_agent_t,
        reader: hsa_code_object_reader_t,
    ) -> HsaResult<hsa_executable_t> {
        let mut exe = hsa_executable_t { handle: 0 };
        let loaded = call!(
            self.core,
            hsa_executable_create_alt_fn(
                HSA_PROFILE_FULL,
                HSA_DEFAULT_FLOAT_ROUNDING_MODE_DEFAULT,
                std::ptr::null(),
                &mut exe
            )
        )
        .and_then(|()| {
            call!(
                self.core,
                hsa_executable_load_agent_code_object_fn(
                    exe,
                    agent,
                    reader,
                    std::ptr::null(),
                    std::ptr::null_mut()
                )
            )
        })
        .and_then(|()| call!(self.core, hsa_executable_freeze_fn(exe, std::ptr::null())));
        let _ = call!(self.core, hsa_code_object_reader_destroy_fn(reader));
        loaded.map(|()| exe)
    }

    /// `hsa_executable_get_symbol_by_name` for `agent`.
    pub fn symbol(
        &self,
        exe: hsa_executable_t,
        agent: hsa_agent_t,
        name: &str,
    ) -> HsaResult<hsa_executable_symbol_t> {
        let name = std::ffi::CString::new(name).map_err(|_| HSA_STATUS_ERROR_INVALID_ARGUMENT)?;
        let mut sym = hsa_executable_symbol_t { handle: 0 };
        call!(
            self.core,
            hsa_executable_get_symbol_by_name_fn(exe, name.as_ptr(), &agent, &mut sym)
        )?;
        Ok(sym)
    }

    /// A 64-bit symbol attribute (`VARIABLE_ADDRESS`, `KERNEL_OBJECT`).
    pub fn symbol_u64(
        &self,
        sym: hsa_executable_symbol_t,
        attribute: hsa_executable_symbol_info_t,
    ) -> HsaResult<u64> {
        let mut value = 0u64;
        call!(
            self.core,
            hsa_executable_symbol_get_info_fn(sym, attribute, (&raw mut value).cast())
        )?;
        Ok(value)
    }

    /// `hsa_executable_destroy`.
    pub fn destroy_executable(&self, exe: hsa_executable_t) -> HsaResult<()> {
        call!(self.core, hsa_executable_destroy_fn(exe))
    }

    /// Submits a kernel dispatch; returns the packet id.
    ///
    /// # Safety
    /// As [`Hsa::submit`]; the kernarg block must stay valid until the dispatch completes.
    pub unsafe fn dispatch(&self, queue: *mut hsa_queue_t, dispatch: &Dispatch) -> u64 {
        // SAFETY: forwarded from the caller.
        unsafe { self.submit(queue, &dispatch_packet(dispatch)) }
    }
}

/// The batch copy entry of an AMD extension table, when its order and declared size hold one.
///
/// # Safety
/// `table` points to a readable AMD extension table at least `minor_id` bytes long.
unsafe fn batch_copy_of(table: *const AmdExtTable) -> Option<BatchCopy> {
    use hsa_sys::layouts::{AmdExtTableV2, amd_ext_is_v2};
    // SAFETY: the version header is the first 16 bytes of every table (caller: readable).
    let version = unsafe { (*table).version };
    let offset = std::mem::offset_of!(AmdExtTableV2, hsa_amd_memory_async_batch_copy_fn);
    if !amd_ext_is_v2(&version) || (version.minor_id as usize) < offset + 8 {
        return None;
    }
    // SAFETY: the entry lies inside the declared size of a table in the 5.6+ order, where it
    // has this type.
    unsafe {
        table
            .cast::<u8>()
            .add(offset)
            .cast::<Option<BatchCopy>>()
            .read()
    }
}

/// From now on calls `wrapper` with every batch of packets the handler chain of the intercept
/// queue `queue` (made by `hsa_amd_queue_intercept_create`) writes into the queue's hardware
/// queue, one call per call of the first-registered handler's writer, and with the write
/// itself, which the wrapper calls once to let the batch through (not calling it drops the
/// batch); replaces any earlier wrapper. What reaches the hardware queue cannot be seen
/// through HSA: the first-registered handler is the last one called (the one nearest the
/// hardware), so no handler registered later sees what it writes.
///
/// `HSA_STATUS_ERROR_NOT_INITIALIZED` without a runtime, `HSA_STATUS_ERROR_INVALID_QUEUE` for
/// anything but a live intercept queue of softhsa's.
pub fn wrap_hardware_writes(
    queue: *const hsa_queue_t,
    wrapper: impl Fn(&[[u8; AQL_PACKET_SIZE]], &mut dyn FnMut()) + Send + Sync + 'static,
) -> HsaResult<()> {
    let queue = crate::runtime::current()?.queue(queue)?;
    let crate::queue::QueueKind::Intercept(state) = &queue.kind else {
        return Err(HSA_STATUS_ERROR_INVALID_QUEUE);
    };
    state.observe(std::sync::Arc::new(wrapper));
    Ok(())
}
