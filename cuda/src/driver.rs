//! The few CUDA driver API entry points kreplay uses, resolved from `libcuda` at run time.
//!
//! Nothing here links against CUDA: `Driver::load` opens the library with `dlopen` and looks
//! each symbol up. A machine without a driver gets a [`LoadError`] naming what was tried, never a
//! panic, so the crate builds and its GPU-free tests run anywhere.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::fmt;
use std::sync::OnceLock;

use libloading::Library;

/// `CUresult`.
pub type CuResult = c_int;
/// `CUdevice` (an ordinal).
pub type CuDevice = c_int;
/// `CUdeviceptr`.
pub type CuDevicePtr = u64;
/// `CUcontext`.
pub type CuContext = *mut c_void;
/// `CUstream`.
pub type CuStream = *mut c_void;
/// `CUfunction`.
pub type CuFunction = *mut c_void;
/// `CUmodule`.
pub type CuModule = *mut c_void;
/// `CUevent`.
pub type CuEvent = *mut c_void;

/// `CUDA_SUCCESS`.
pub const CUDA_SUCCESS: CuResult = 0;
/// `CU_STREAM_NON_BLOCKING`: kreplay's stream never waits for the legacy default stream.
pub const CU_STREAM_NON_BLOCKING: c_uint = 0x1;
/// `CU_STREAM_PER_THREAD`: the handle of the calling thread's default stream.
pub const CU_STREAM_PER_THREAD: usize = 0x2;
/// `CU_MEMHOSTREGISTER_PORTABLE`.
pub const CU_MEMHOSTREGISTER_PORTABLE: c_uint = 0x1;
/// `CU_MEMHOSTREGISTER_DEVICEMAP`: the registered range gets a device address too.
pub const CU_MEMHOSTREGISTER_DEVICEMAP: c_uint = 0x2;
/// `CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES` (static shared memory of a function).
pub const CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: c_int = 1;
/// `CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES` (local memory per thread).
pub const CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: c_int = 3;
/// `CU_STREAM_CAPTURE_STATUS_NONE`.
pub const CU_STREAM_CAPTURE_STATUS_NONE: c_int = 0;
/// `CU_STREAM_CAPTURE_MODE_RELAXED`: the calling thread may make calls that a capture in
/// progress (on this or another thread) would otherwise forbid, without invalidating it.
pub const CU_STREAM_CAPTURE_MODE_RELAXED: c_int = 2;

/// `CUlaunchConfig` of `cuLaunchKernelEx` (cuda.h, CUDA 12 and 13).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CuLaunchConfig {
    /// Grid size in blocks.
    pub grid_dim: [c_uint; 3],
    /// Block size in threads.
    pub block_dim: [c_uint; 3],
    /// Dynamic shared memory per block.
    pub shared_mem_bytes: c_uint,
    /// Stream.
    pub stream: CuStream,
    /// Launch attributes (`CUlaunchAttribute *`), passed through untouched.
    pub attrs: *mut c_void,
    /// Number of attributes.
    pub num_attrs: c_uint,
}

/// `CUmemAllocationProp` (cuda.h, CUDA 10.2 to 13), as
/// `cuMemGetAllocationPropertiesFromHandle` fills it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CuMemAllocationProp {
    /// `CUmemAllocationType`.
    pub alloc_type: c_int,
    /// `CUmemAllocationHandleType`.
    pub requested_handle_types: c_int,
    /// `CUmemLocation::type` (`CU_MEM_LOCATION_TYPE_DEVICE` = 1).
    pub location_type: c_int,
    /// `CUmemLocation::id` (the device ordinal for a device location).
    pub location_id: c_int,
    /// `win32HandleMetaData`.
    pub win32_handle_meta_data: *mut c_void,
    /// `allocFlags` (compression type, RDMA capable, usage, reserved).
    pub alloc_flags: [u8; 8],
}

/// The driver library could not be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadError(pub String);

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LoadError {}

/// A failed driver call: which one and what the driver said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CuError {
    /// The entry point.
    pub call: &'static str,
    /// Its `CUresult`.
    pub code: CuResult,
    /// The driver's name for the code (`CUDA_ERROR_...`), when it gave one.
    pub name: String,
}

impl fmt::Display for CuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {} ({})", self.call, self.name, self.code)
    }
}

impl std::error::Error for CuError {}

type LaunchKernelFn = unsafe extern "C" fn(
    CuFunction,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    CuStream,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CuResult;
type LaunchKernelExFn = unsafe extern "C" fn(
    *const CuLaunchConfig,
    CuFunction,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CuResult;
/// `cuLaunchCooperativeKernel` (and `_ptsz`): `cuLaunchKernel`'s arguments without `extra`.
type LaunchCooperativeKernelFn = unsafe extern "C" fn(
    CuFunction,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    CuStream,
    *mut *mut c_void,
) -> CuResult;

/// Entry points kreplay uses where the driver has them, `None` where it does not (older
/// drivers): what needs them degrades as documented at each use.
#[derive(Clone, Copy)]
#[allow(missing_docs)]
pub struct Optional {
    /// `cuFuncGetModule` (CUDA 11.0).
    pub func_get_module: Option<unsafe extern "C" fn(*mut CuModule, CuFunction) -> CuResult>,
    /// `cuModuleGetGlobal_v2`.
    pub module_get_global: Option<
        unsafe extern "C" fn(*mut CuDevicePtr, *mut usize, CuModule, *const c_char) -> CuResult,
    >,
    /// `cuFuncGetParamInfo` (CUDA 12.4).
    pub func_get_param_info:
        Option<unsafe extern "C" fn(CuFunction, usize, *mut usize, *mut usize) -> CuResult>,
    /// `cuKernelGetFunction` (CUDA 12.0): a `CUkernel`'s function in the current context.
    pub kernel_get_function: Option<unsafe extern "C" fn(*mut CuFunction, *mut c_void) -> CuResult>,
    /// `cuFuncLoad` (CUDA 12.4): load a lazily loaded function now.
    pub func_load: Option<unsafe extern "C" fn(CuFunction) -> CuResult>,
    /// `cuPointerGetAttribute`.
    pub pointer_get_attribute:
        Option<unsafe extern "C" fn(*mut c_void, c_int, CuDevicePtr) -> CuResult>,
    /// `cuGraphGetNodes` (CUDA 10.0): a graph's nodes (`CUgraph`, `CUgraphNode *`, `size_t *`).
    pub graph_get_nodes:
        Option<unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut usize) -> CuResult>,
    /// `cuGraphNodeGetType` (CUDA 10.0).
    pub graph_node_get_type: Option<unsafe extern "C" fn(*mut c_void, *mut c_int) -> CuResult>,
    /// `cuGraphMemAllocNodeGetParams` (CUDA 11.4, with allocation nodes).
    pub graph_mem_alloc_node_get_params: Option<
        unsafe extern "C" fn(*mut c_void, *mut crate::cupti::MemAllocNodeParams) -> CuResult,
    >,
    /// `cuGraphMemFreeNodeGetParams` (CUDA 11.4).
    pub graph_mem_free_node_get_params:
        Option<unsafe extern "C" fn(*mut c_void, *mut CuDevicePtr) -> CuResult>,
    /// `cuGraphChildGraphNodeGetGraph` (CUDA 10.0).
    pub graph_child_graph_node_get_graph:
        Option<unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> CuResult>,
}

/// `CUDA_ERROR_INVALID_VALUE`: among others, a parameter index past the function's last.
pub const CUDA_ERROR_INVALID_VALUE: CuResult = 1;
/// `CUDA_ERROR_INVALID_CONTEXT`: the handle names no context the driver knows.
pub const CUDA_ERROR_INVALID_CONTEXT: CuResult = 201;
/// `CUDA_ERROR_CONTEXT_IS_DESTROYED`: the context was destroyed (a primary context reset).
pub const CUDA_ERROR_CONTEXT_IS_DESTROYED: CuResult = 709;
/// `CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS`.
pub const CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS: c_int = 88;
/// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`.
pub const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: c_int = 2;
/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`.
pub const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_int = 9;
/// `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR`.
pub const CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: c_int = 11;
/// `CU_POINTER_ATTRIBUTE_RANGE_SIZE`.
pub const CU_POINTER_ATTRIBUTE_RANGE_SIZE: c_int = 12;
/// `CU_MEMORYTYPE_HOST`.
pub const CU_MEMORYTYPE_HOST: c_uint = 1;
/// `CU_MEMORYTYPE_DEVICE`.
pub const CU_MEMORYTYPE_DEVICE: c_uint = 2;
/// `CU_MEMORYTYPE_ARRAY`.
pub const CU_MEMORYTYPE_ARRAY: c_uint = 3;
/// `CU_MEMORYTYPE_UNIFIED`.
pub const CU_MEMORYTYPE_UNIFIED: c_uint = 4;

macro_rules! driver_table {
    ($( $field:ident : $sym:literal => fn($($arg:ty),*) ; )*) => {
        /// The resolved entry points (see the module docs). Fields are the raw C functions;
        /// call them through the safe-ish wrappers below where one exists.
        #[allow(missing_docs)]
        pub struct Driver {
            _lib: Library,
            $( pub $field: unsafe extern "C" fn($($arg),*) -> CuResult, )*
            pub launch_kernel: LaunchKernelFn,
            pub launch_kernel_ptsz: LaunchKernelFn,
            pub launch_kernel_ex: Option<LaunchKernelExFn>,
            pub launch_kernel_ex_ptsz: Option<LaunchKernelExFn>,
            pub launch_cooperative_kernel: Option<LaunchCooperativeKernelFn>,
            pub launch_cooperative_kernel_ptsz: Option<LaunchCooperativeKernelFn>,
            /// Entry points newer drivers have (`None` on older ones).
            pub optional: Optional,
        }

        impl Driver {
            fn resolve(lib: Library) -> Result<Driver, LoadError> {
                // SAFETY: each symbol is looked up by its exported C name and given the
                // prototype cuda.h declares for it; the pointers stay valid while `_lib` (kept
                // in the struct) is loaded.
                unsafe {
                    $( let $field = *lib
                        .get::<unsafe extern "C" fn($($arg),*) -> CuResult>($sym)
                        .map_err(|e| LoadError(format!("libcuda lacks {}: {e}",
                            String::from_utf8_lossy(&$sym[..$sym.len() - 1]))))?; )*
                    let launch_kernel = *lib.get::<LaunchKernelFn>(b"cuLaunchKernel\0")
                        .map_err(|e| LoadError(format!("libcuda lacks cuLaunchKernel: {e}")))?;
                    let launch_kernel_ptsz = *lib.get::<LaunchKernelFn>(b"cuLaunchKernel_ptsz\0")
                        .map_err(|e| LoadError(format!("libcuda lacks cuLaunchKernel_ptsz: {e}")))?;
                    let launch_kernel_ex = lib.get::<LaunchKernelExFn>(b"cuLaunchKernelEx\0")
                        .ok().map(|s| *s);
                    let launch_kernel_ex_ptsz = lib.get::<LaunchKernelExFn>(b"cuLaunchKernelEx_ptsz\0")
                        .ok().map(|s| *s);
                    let launch_cooperative_kernel = lib
                        .get::<LaunchCooperativeKernelFn>(b"cuLaunchCooperativeKernel\0")
                        .ok().map(|s| *s);
                    let launch_cooperative_kernel_ptsz = lib
                        .get::<LaunchCooperativeKernelFn>(b"cuLaunchCooperativeKernel_ptsz\0")
                        .ok().map(|s| *s);
                    let optional = Optional {
                        func_get_module: lib.get(b"cuFuncGetModule\0").ok().map(|s| *s),
                        module_get_global: lib.get(b"cuModuleGetGlobal_v2\0").ok().map(|s| *s),
                        func_get_param_info: lib.get(b"cuFuncGetParamInfo\0").ok().map(|s| *s),
                        kernel_get_function: lib.get(b"cuKernelGetFunction\0").ok().map(|s| *s),
                        func_load: lib.get(b"cuFuncLoad\0").ok().map(|s| *s),
                        pointer_get_attribute: lib.get(b"cuPointerGetAttribute\0").ok().map(|s| *s),
                        graph_get_nodes: lib.get(b"cuGraphGetNodes\0").ok().map(|s| *s),
                        graph_node_get_type: lib.get(b"cuGraphNodeGetType\0").ok().map(|s| *s),
                        graph_mem_alloc_node_get_params: lib
                            .get(b"cuGraphMemAllocNodeGetParams\0").ok().map(|s| *s),
                        graph_mem_free_node_get_params: lib
                            .get(b"cuGraphMemFreeNodeGetParams\0").ok().map(|s| *s),
                        graph_child_graph_node_get_graph: lib
                            .get(b"cuGraphChildGraphNodeGetGraph\0").ok().map(|s| *s),
                    };
                    Ok(Driver { _lib: lib, $( $field, )* launch_kernel, launch_kernel_ptsz,
                        launch_kernel_ex, launch_kernel_ex_ptsz, launch_cooperative_kernel,
                        launch_cooperative_kernel_ptsz, optional })
                }
            }
        }
    };
}

driver_table! {
    init: b"cuInit\0" => fn(c_uint);
    driver_get_version: b"cuDriverGetVersion\0" => fn(*mut c_int);
    get_error_name: b"cuGetErrorName\0" => fn(CuResult, *mut *const c_char);
    device_get_count: b"cuDeviceGetCount\0" => fn(*mut c_int);
    device_get: b"cuDeviceGet\0" => fn(*mut CuDevice, c_int);
    device_get_attribute: b"cuDeviceGetAttribute\0" => fn(*mut c_int, c_int, CuDevice);
    primary_ctx_retain: b"cuDevicePrimaryCtxRetain\0" => fn(*mut CuContext, CuDevice);
    primary_ctx_release: b"cuDevicePrimaryCtxRelease_v2\0" => fn(CuDevice);
    ctx_get_current: b"cuCtxGetCurrent\0" => fn(*mut CuContext);
    ctx_set_current: b"cuCtxSetCurrent\0" => fn(CuContext);
    ctx_get_device: b"cuCtxGetDevice\0" => fn(*mut CuDevice);
    ctx_synchronize: b"cuCtxSynchronize\0" => fn();
    stream_create: b"cuStreamCreate\0" => fn(*mut CuStream, c_uint);
    stream_destroy: b"cuStreamDestroy_v2\0" => fn(CuStream);
    stream_synchronize: b"cuStreamSynchronize\0" => fn(CuStream);
    stream_synchronize_ptsz: b"cuStreamSynchronize_ptsz\0" => fn(CuStream);
    stream_is_capturing: b"cuStreamIsCapturing\0" => fn(CuStream, *mut c_int);
    stream_is_capturing_ptsz: b"cuStreamIsCapturing_ptsz\0" => fn(CuStream, *mut c_int);
    thread_exchange_stream_capture_mode: b"cuThreadExchangeStreamCaptureMode\0" => fn(*mut c_int);
    mem_alloc: b"cuMemAlloc_v2\0" => fn(*mut CuDevicePtr, usize);
    mem_free: b"cuMemFree_v2\0" => fn(CuDevicePtr);
    mem_get_info: b"cuMemGetInfo_v2\0" => fn(*mut usize, *mut usize);
    mem_get_allocation_properties_from_handle: b"cuMemGetAllocationPropertiesFromHandle\0" => fn(*mut CuMemAllocationProp, u64);
    memcpy_dtod_async: b"cuMemcpyDtoDAsync_v2\0" => fn(CuDevicePtr, CuDevicePtr, usize, CuStream);
    memcpy_dtoh_async: b"cuMemcpyDtoHAsync_v2\0" => fn(*mut c_void, CuDevicePtr, usize, CuStream);
    memcpy_htod_async: b"cuMemcpyHtoDAsync_v2\0" => fn(CuDevicePtr, *const c_void, usize, CuStream);
    memset_d8_async: b"cuMemsetD8Async\0" => fn(CuDevicePtr, u8, usize, CuStream);
    mem_alloc_host: b"cuMemAllocHost_v2\0" => fn(*mut *mut c_void, usize);
    mem_free_host: b"cuMemFreeHost\0" => fn(*mut c_void);
    mem_host_register: b"cuMemHostRegister_v2\0" => fn(*mut c_void, usize, c_uint);
    mem_host_unregister: b"cuMemHostUnregister\0" => fn(*mut c_void);
    mem_host_get_device_pointer: b"cuMemHostGetDevicePointer_v2\0" => fn(*mut CuDevicePtr, *mut c_void, c_uint);
    func_get_attribute: b"cuFuncGetAttribute\0" => fn(*mut c_int, c_int, CuFunction);
    module_load_data: b"cuModuleLoadData\0" => fn(*mut CuModule, *const c_void);
    module_get_function: b"cuModuleGetFunction\0" => fn(*mut CuFunction, CuModule, *const c_char);
    module_unload: b"cuModuleUnload\0" => fn(CuModule);
    event_create: b"cuEventCreate\0" => fn(*mut CuEvent, c_uint);
    event_record: b"cuEventRecord\0" => fn(CuEvent, CuStream);
    event_synchronize: b"cuEventSynchronize\0" => fn(CuEvent);
    event_elapsed_time: b"cuEventElapsedTime\0" => fn(*mut f32, CuEvent, CuEvent);
    event_destroy: b"cuEventDestroy_v2\0" => fn(CuEvent);
}

impl Driver {
    /// The module of a launched function. A `CUkernel` (context-independent, launched as a
    /// `CUfunction`) is first turned into its function in the current context.
    ///
    /// # Safety
    /// `f` is a function (or kernel) handle the driver gave out, being launched.
    pub unsafe fn function_module(&self, f: CuFunction) -> Result<CuModule, String> {
        let get = self
            .optional
            .func_get_module
            .ok_or("this driver has no cuFuncGetModule")?;
        let mut m: CuModule = std::ptr::null_mut();
        // SAFETY: writes one handle; an invalid function is an error code.
        let rc = unsafe { get(&mut m, f) };
        if rc == CUDA_SUCCESS {
            return Ok(m);
        }
        let first = self.check("cuFuncGetModule", rc).unwrap_err();
        let Some(kernel_get_function) = self.optional.kernel_get_function else {
            return Err(first.to_string());
        };
        let mut g: CuFunction = std::ptr::null_mut();
        // SAFETY: as above; a handle that is no CUkernel is an error code.
        let rc = unsafe { kernel_get_function(&mut g, f) };
        if rc != CUDA_SUCCESS {
            return Err(first.to_string());
        }
        // SAFETY: as above, with the kernel's function.
        let rc = unsafe { get(&mut m, g) };
        self.check("cuFuncGetModule", rc)
            .map_err(|e| e.to_string())?;
        Ok(m)
    }

    /// Address and size of variable `name` of `module`.
    ///
    /// # Safety
    /// `module` is a loaded module's handle the driver gave out.
    pub unsafe fn module_global(&self, module: CuModule, name: &str) -> Option<(u64, u64)> {
        let get = self.optional.module_get_global?;
        let name = std::ffi::CString::new(name).ok()?;
        let (mut ptr, mut size): (CuDevicePtr, usize) = (0, 0);
        // SAFETY: writes an address and a size; an unknown name is an error code.
        let rc = unsafe { get(&mut ptr, &mut size, module, name.as_ptr()) };
        (rc == CUDA_SUCCESS).then_some((ptr, size as u64))
    }

    /// The parameters (offset, size) of function `f` (`cuFuncGetParamInfo`), `None` when the
    /// driver cannot describe them. A `CUkernel` launched as a `CUfunction` (what the runtime
    /// launches with since CUDA 12) is described through its function in the current context
    /// (`cuKernelGetFunction`).
    ///
    /// # Safety
    /// `f` is a function (or kernel) handle the driver gave out, being launched.
    pub unsafe fn param_layout(&self, f: CuFunction) -> Option<Vec<(usize, usize)>> {
        let info = self.optional.func_get_param_info?;
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: writes two size_t; a handle or index the driver refuses is an error code.
        let first = unsafe { info(f, 0, &mut offset, &mut size) };
        let f = if first == CUDA_SUCCESS {
            f
        } else {
            // Not described as a function (or described as one without parameters): a
            // CUkernel's function in the current context, when it is one.
            let as_kernel = self.optional.kernel_get_function.and_then(|get| {
                let mut g: CuFunction = std::ptr::null_mut();
                // SAFETY: writes one handle; a handle that is no CUkernel is an error code.
                let rc = unsafe { get(&mut g, f) };
                (rc == CUDA_SUCCESS && !g.is_null() && g != f).then_some(g)
            });
            match as_kernel {
                Some(g) => g,
                None if first == CUDA_ERROR_INVALID_VALUE => return Some(Vec::new()),
                None => return None,
            }
        };
        let mut out = Vec::new();
        for index in 0..4096usize {
            let (mut offset, mut size) = (0usize, 0usize);
            // SAFETY: writes two size_t; an index past the last parameter is an error code.
            let rc = unsafe { info(f, index, &mut offset, &mut size) };
            if rc == CUDA_ERROR_INVALID_VALUE {
                return Some(out);
            }
            if rc != CUDA_SUCCESS {
                return None;
            }
            out.push((offset, size));
        }
        None
    }

    /// Whether device `ordinal` reads and writes pageable host memory directly
    /// (`CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS`: HMM, or ATS on a Grace Hopper machine).
    /// `None` when the driver cannot say.
    pub fn pageable_memory_access(&self, ordinal: i32) -> Option<bool> {
        let mut device: CuDevice = 0;
        let mut value: c_int = 0;
        // SAFETY: out-parameters of the types cuda.h declares; an unknown ordinal or attribute
        // is an error code.
        let ok = unsafe {
            (self.device_get)(&raw mut device, ordinal) == CUDA_SUCCESS
                && (self.device_get_attribute)(
                    &raw mut value,
                    CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS,
                    device,
                ) == CUDA_SUCCESS
        };
        ok.then_some(value != 0)
    }

    /// What the driver knows `addr` to be, when it is memory (`None`: not an address of any
    /// allocation the driver knows).
    pub fn memory_type(&self, addr: u64) -> Option<c_uint> {
        let get = self.optional.pointer_get_attribute?;
        let mut kind: c_uint = 0;
        // SAFETY: the memory-type attribute is one unsigned int; an unknown address is an error
        // code.
        let rc = unsafe {
            get(
                (&raw mut kind).cast(),
                CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                addr,
            )
        };
        (rc == CUDA_SUCCESS && kind != 0).then_some(kind)
    }

    /// The first address of the driver's allocation holding `addr` (the driver may round an
    /// allocation up beyond the size asked for).
    pub fn range_start(&self, addr: u64) -> Option<u64> {
        let get = self.optional.pointer_get_attribute?;
        let mut start: CuDevicePtr = 0;
        // SAFETY: the range-start attribute is one CUdeviceptr; an unknown address is an error
        // code.
        let rc = unsafe {
            get(
                (&raw mut start).cast(),
                CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                addr,
            )
        };
        (rc == CUDA_SUCCESS).then_some(start)
    }

    /// The size of the driver's allocation holding `addr` (`None` when it knows none).
    pub fn range_size(&self, addr: u64) -> Option<u64> {
        let get = self.optional.pointer_get_attribute?;
        let mut size: usize = 0;
        // SAFETY: the range-size attribute is one size_t; an unknown address is an error code.
        let rc = unsafe {
            get(
                (&raw mut size).cast(),
                CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                addr,
            )
        };
        (rc == CUDA_SUCCESS && size > 0).then_some(size as u64)
    }

    /// Whether `stream` is being captured into a graph (`cuStreamIsCapturing`, `_ptsz` for a
    /// per-thread-stream call): `Some(true)` also for a capture already invalidated, whose
    /// calls still add no work; `None` when the driver cannot say (on the legacy stream while
    /// another stream captures, among others).
    ///
    /// # Safety
    /// `stream` is a stream handle the application passed to a call in progress (or a
    /// special handle: null, `CU_STREAM_PER_THREAD`).
    pub unsafe fn stream_capturing(&self, stream: CuStream, per_thread: bool) -> Option<bool> {
        let f = if per_thread {
            self.stream_is_capturing_ptsz
        } else {
            self.stream_is_capturing
        };
        let mut status = CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: a stream the application passed (the caller's promise); writes one
        // CUstreamCaptureStatus, and an invalid stream is an error code.
        let rc = unsafe { f(stream, &mut status) };
        (rc == CUDA_SUCCESS).then_some(status != CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// The ordinal of the device whose memory `addr` is (`None` when the driver cannot say).
    pub fn device_ordinal(&self, addr: u64) -> Option<i32> {
        let get = self.optional.pointer_get_attribute?;
        let mut ordinal: c_int = -1;
        // SAFETY: the device-ordinal attribute is one int; an unknown address is an error code.
        let rc = unsafe {
            get(
                (&raw mut ordinal).cast(),
                CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                addr,
            )
        };
        (rc == CUDA_SUCCESS && ordinal >= 0).then_some(ordinal)
    }
}

/// The graph nodes of the driver, for [`crate::graphmem::walk`]: graph and node handles the
/// application gave or the driver returned, read inside the application's call that holds them.
#[derive(Clone, Copy, Debug)]
pub struct DriverGraphs<'a>(pub &'a Driver);

impl DriverGraphs<'_> {
    fn entry<T>(&self, f: Option<T>, name: &str) -> Result<T, String> {
        f.ok_or_else(|| format!("this driver has no {name}"))
    }
    fn call(&self, call: &'static str, rc: CuResult) -> Result<(), String> {
        self.0.check(call, rc).map_err(|e| e.to_string())
    }
}

impl crate::graphmem::GraphApi for DriverGraphs<'_> {
    fn nodes(&self, graph: usize) -> Result<Vec<usize>, String> {
        let get = self.entry(self.0.optional.graph_get_nodes, "cuGraphGetNodes")?;
        let mut count: usize = 0;
        // SAFETY: with a null array, writes the node count; an invalid graph is an error code.
        let rc = unsafe { get(graph as *mut c_void, std::ptr::null_mut(), &mut count) };
        self.call("cuGraphGetNodes", rc)?;
        let mut nodes: Vec<*mut c_void> = vec![std::ptr::null_mut(); count];
        // SAFETY: writes at most `count` handles into an array of `count`, and the number
        // written into `count`.
        let rc = unsafe { get(graph as *mut c_void, nodes.as_mut_ptr(), &mut count) };
        self.call("cuGraphGetNodes", rc)?;
        nodes.truncate(count);
        Ok(nodes.into_iter().map(|n| n as usize).collect())
    }
    fn node_type(&self, node: usize) -> Result<i32, String> {
        let get = self.entry(self.0.optional.graph_node_get_type, "cuGraphNodeGetType")?;
        let mut t: c_int = -1;
        // SAFETY: writes one CUgraphNodeType; an invalid node is an error code.
        let rc = unsafe { get(node as *mut c_void, &mut t) };
        self.call("cuGraphNodeGetType", rc)?;
        Ok(t)
    }
    fn alloc(&self, node: usize) -> Result<crate::graphmem::GraphAlloc, String> {
        let get = self.entry(
            self.0.optional.graph_mem_alloc_node_get_params,
            "cuGraphMemAllocNodeGetParams",
        )?;
        let mut p = std::mem::MaybeUninit::<crate::cupti::MemAllocNodeParams>::zeroed();
        // SAFETY: writes one CUDA_MEM_ALLOC_NODE_PARAMS (its pointers are the node's own); an
        // invalid node is an error code.
        let rc = unsafe { get(node as *mut c_void, p.as_mut_ptr()) };
        self.call("cuGraphMemAllocNodeGetParams", rc)?;
        // SAFETY: zeroed is a valid value of the struct (integers and pointers), and the
        // driver filled it.
        Ok(unsafe { p.assume_init() }.allocation())
    }
    fn freed(&self, node: usize) -> Result<u64, String> {
        let get = self.entry(
            self.0.optional.graph_mem_free_node_get_params,
            "cuGraphMemFreeNodeGetParams",
        )?;
        let mut dptr: CuDevicePtr = 0;
        // SAFETY: writes one CUdeviceptr; an invalid node is an error code.
        let rc = unsafe { get(node as *mut c_void, &mut dptr) };
        self.call("cuGraphMemFreeNodeGetParams", rc)?;
        Ok(dptr)
    }
    fn child(&self, node: usize) -> Result<usize, String> {
        let get = self.entry(
            self.0.optional.graph_child_graph_node_get_graph,
            "cuGraphChildGraphNodeGetGraph",
        )?;
        let mut g: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one CUgraph (owned by the node); an invalid node is an error code.
        let rc = unsafe { get(node as *mut c_void, &mut g) };
        self.call("cuGraphChildGraphNodeGetGraph", rc)?;
        Ok(g as usize)
    }
}

impl fmt::Debug for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Driver").finish_non_exhaustive()
    }
}

/// The calling thread's capture interaction mode held at relaxed (see
/// [`Driver::relaxed_capture`]); dropping it restores the previous mode.
#[derive(Debug)]
#[must_use = "the mode is restored when this is dropped"]
pub struct RelaxedCapture<'a> {
    driver: &'a Driver,
    /// The mode to put back (`None`: the exchange failed, nothing to restore).
    previous: Option<c_int>,
    /// The mode belongs to the thread that exchanged it.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for RelaxedCapture<'_> {
    fn drop(&mut self) {
        if let Some(mut mode) = self.previous.take() {
            // SAFETY: swaps one int with the calling thread's mode (the one this value
            // replaced on this same thread: it is not Send).
            unsafe { (self.driver.thread_exchange_stream_capture_mode)(&mut mode) };
        }
    }
}

static DRIVER: OnceLock<Result<Driver, LoadError>> = OnceLock::new();

/// Library names tried, in order, when `KREPLAY_CUDA_DRIVER` does not name one.
pub const DRIVER_NAMES: [&str; 2] = ["libcuda.so.1", "libcuda.so"];

impl Driver {
    /// Open `path` as the driver library and resolve every entry point, then `cuInit(0)`.
    pub fn load_from(path: &str) -> Result<Driver, LoadError> {
        let driver = Driver::open(path)?;
        // SAFETY: cuInit takes a flags word that must be 0.
        let rc = unsafe { (driver.init)(0) };
        if rc != CUDA_SUCCESS {
            return Err(LoadError(format!(
                "cuInit failed: {} ({rc}): no usable GPU",
                driver.error_name(rc)
            )));
        }
        Ok(driver)
    }

    /// Open `path` and resolve every entry point, without calling `cuInit`.
    fn open(path: &str) -> Result<Driver, LoadError> {
        // SAFETY: loading libcuda runs its initialisers, which have no preconditions on us.
        let lib = unsafe { Library::new(path) }
            .map_err(|e| LoadError(format!("cannot load the CUDA driver {path}: {e}")))?;
        Driver::resolve(lib)
    }

    /// Open the driver (`KREPLAY_CUDA_DRIVER`, else [`DRIVER_NAMES`]); `init` calls `cuInit`.
    fn load(init: bool) -> Result<Driver, LoadError> {
        let one = |path: &str| {
            if init {
                Driver::load_from(path)
            } else {
                Driver::open(path)
            }
        };
        if let Ok(path) = std::env::var("KREPLAY_CUDA_DRIVER") {
            return one(&path);
        }
        let mut notes = Vec::new();
        for name in DRIVER_NAMES {
            match one(name) {
                Ok(d) => return Ok(d),
                Err(e) => notes.push(e.0),
            }
        }
        Err(LoadError(notes.join("; ")))
    }

    /// The process-wide driver, loaded (and `cuInit` called) on first use. A machine without
    /// a driver or GPU gets the reason, never a panic.
    pub fn get() -> Result<&'static Driver, LoadError> {
        DRIVER
            .get_or_init(|| Driver::load(true))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The process-wide driver for code running inside `cuInit` (the injection entry point):
    /// resolved without calling `cuInit` again.
    pub fn get_in_init() -> Result<&'static Driver, LoadError> {
        DRIVER
            .get_or_init(|| Driver::load(false))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The driver's name for a `CUresult`.
    pub fn error_name(&self, code: CuResult) -> String {
        let mut name: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorName writes a pointer to a static string (or leaves it unset and
        // returns an error for an unknown code).
        let rc = unsafe { (self.get_error_name)(code, &mut name) };
        if rc != CUDA_SUCCESS || name.is_null() {
            return format!("CUresult {code}");
        }
        // SAFETY: the driver returned a NUL-terminated static string.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }

    /// Turn a `CUresult` into a `Result`.
    pub fn check(&self, call: &'static str, code: CuResult) -> Result<(), CuError> {
        if code == CUDA_SUCCESS {
            Ok(())
        } else {
            Err(CuError {
                call,
                code,
                name: self.error_name(code),
            })
        }
    }

    /// The calling thread's current context (null when none).
    pub fn current_context(&self) -> CuContext {
        let mut ctx: CuContext = std::ptr::null_mut();
        // SAFETY: writes one pointer.
        let rc = unsafe { (self.ctx_get_current)(&mut ctx) };
        if rc == CUDA_SUCCESS {
            ctx
        } else {
            std::ptr::null_mut()
        }
    }

    /// Make `ctx` current on the calling thread unless it already is.
    ///
    /// # Safety
    /// `ctx` is a context handle the driver gave out and that has not been destroyed.
    pub unsafe fn make_current(&self, ctx: CuContext) -> Result<(), CuError> {
        if self.current_context() == ctx {
            return Ok(());
        }
        // SAFETY: ctx is alive by the caller's promise.
        self.check("cuCtxSetCurrent", unsafe { (self.ctx_set_current)(ctx) })
    }

    /// The device ordinal of the current context.
    pub fn current_device(&self) -> Result<CuDevice, CuError> {
        let mut dev: CuDevice = 0;
        // SAFETY: writes one int.
        self.check("cuCtxGetDevice", unsafe { (self.ctx_get_device)(&mut dev) })?;
        Ok(dev)
    }

    /// Free and total memory of the current context's device.
    pub fn mem_info(&self) -> Result<(u64, u64), CuError> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two size_t.
        self.check("cuMemGetInfo_v2", unsafe {
            (self.mem_get_info)(&mut free, &mut total)
        })?;
        Ok((free as u64, total as u64))
    }

    /// Where the physical memory behind VMM allocation handle `handle` lives.
    pub fn handle_location(&self, handle: u64) -> crate::tracking::HandleLocation {
        let mut prop = CuMemAllocationProp {
            alloc_type: 0,
            requested_handle_types: 0,
            location_type: 0,
            location_id: 0,
            win32_handle_meta_data: std::ptr::null_mut(),
            alloc_flags: [0; 8],
        };
        // SAFETY: writes one CUmemAllocationProp; an unknown handle is an error code, not UB.
        let rc = unsafe { (self.mem_get_allocation_properties_from_handle)(&mut prop, handle) };
        match self.check("cuMemGetAllocationPropertiesFromHandle", rc) {
            Ok(()) => {
                crate::tracking::HandleLocation::from_location(prop.location_type, prop.location_id)
            }
            Err(e) => crate::tracking::HandleLocation::Unknown(e.to_string()),
        }
    }

    /// Switch the calling thread's stream-capture interaction mode to relaxed until the returned
    /// value is dropped, which puts the previous mode back (on every path, unwinding included).
    ///
    /// kreplay's own driver calls inside an application's call (snapshot copies, shadow
    /// allocations, synchronizations, events) run this way: a capture in
    /// `CU_STREAM_CAPTURE_MODE_GLOBAL` on another thread (the default of
    /// `cudaStreamBeginCapture`, and what PyTorch's CUDA graphs use) would otherwise make them
    /// fail and invalidate that capture. Relaxed mode does not allow what necessarily conflicts
    /// with a capture (synchronizing a capturing stream, or a context one of whose streams
    /// captures): kreplay never does that (see `crate::capture`).
    pub fn relaxed_capture(&self) -> RelaxedCapture<'_> {
        let mut mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: swaps one int with the calling thread's mode.
        let rc = unsafe { (self.thread_exchange_stream_capture_mode)(&mut mode) };
        RelaxedCapture {
            driver: self,
            previous: (rc == CUDA_SUCCESS).then_some(mode),
            _not_send: std::marker::PhantomData,
        }
    }

    /// Number of devices.
    pub fn device_count(&self) -> Result<i32, CuError> {
        let mut n: c_int = 0;
        // SAFETY: writes one int.
        self.check("cuDeviceGetCount", unsafe {
            (self.device_get_count)(&mut n)
        })?;
        Ok(n)
    }
}
