//! The part of CUPTI's callback API kreplay uses, declared here from the public headers
//! (`cupti_callbacks.h`, `cupti_driver_cbid.h`, `generated_cuda_meta.h`) and resolved from
//! `libcupti` at run time.

use std::ffi::{c_char, c_int, c_uint, c_void};

use libloading::Library;

use crate::driver::{CuContext, CuDevicePtr, CuFunction, CuLaunchConfig, CuStream};

/// `CUptiResult`.
pub type CuptiResult = c_int;
/// `CUpti_CallbackDomain`.
pub type CallbackDomain = c_int;
/// `CUpti_CallbackId`.
pub type CallbackId = u32;
/// `CUpti_SubscriberHandle`.
pub type SubscriberHandle = *mut c_void;
/// `CUpti_CallbackFunc`.
pub type CallbackFunc = unsafe extern "C" fn(
    userdata: *mut c_void,
    domain: CallbackDomain,
    cbid: CallbackId,
    data: *const c_void,
);

/// `CUPTI_CB_DOMAIN_DRIVER_API`.
pub const CB_DOMAIN_DRIVER_API: CallbackDomain = 1;
/// `CUPTI_CB_DOMAIN_RESOURCE`.
pub const CB_DOMAIN_RESOURCE: CallbackDomain = 3;
/// `CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING` (`CUpti_CallbackIdResource`): a context is
/// about to be destroyed, by `cuCtxDestroy`, a primary context's reset (`cudaDeviceReset`) or
/// its last release.
pub const CBID_RESOURCE_CONTEXT_DESTROY_STARTING: CallbackId = 2;
/// `CUPTI_CBID_RESOURCE_MODULE_LOADED`.
pub const CBID_RESOURCE_MODULE_LOADED: CallbackId = 6;
/// `CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING`.
pub const CBID_RESOURCE_MODULE_UNLOAD_STARTING: CallbackId = 7;

/// `CUpti_ResourceData` (cupti_callbacks.h): the data of a resource-domain callback.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ResourceData {
    /// The context concerned.
    pub context: CuContext,
    /// `resourceHandle` (a union holding a `CUstream`).
    pub resource_handle: *mut c_void,
    /// For module callbacks, a `CUpti_ModuleResourceData`.
    pub resource_descriptor: *mut c_void,
}

/// `CUpti_ModuleResourceData` (cupti_callbacks.h): the module a module callback is about.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ModuleResourceData {
    /// CUPTI's id of the module.
    pub module_id: u32,
    /// Size of the cubin.
    pub cubin_size: usize,
    /// The cubin the driver loaded.
    pub cubin: *const c_char,
}

/// `CUPTI_API_ENTER`.
pub const API_ENTER: c_int = 0;
/// `CUPTI_API_EXIT`.
pub const API_EXIT: c_int = 1;

/// Driver-API callback ids (`CUpti_driver_api_trace_cbid`), as CUDA 13.0's
/// `cupti_driver_cbid.h` numbers them (read from the header on the project's H200 machine).
#[allow(missing_docs)]
pub mod cbid {
    use super::CallbackId;
    pub const CU_MEM_ALLOC_V2: CallbackId = 243;
    pub const CU_MEM_ALLOC_PITCH_V2: CallbackId = 244;
    pub const CU_MEM_FREE_V2: CallbackId = 245;
    pub const CU_LAUNCH_KERNEL: CallbackId = 307;
    pub const CU_MEM_ALLOC_MANAGED: CallbackId = 371;
    pub const CU_LAUNCH_KERNEL_PTSZ: CallbackId = 442;
    pub const CU_LAUNCH_COOPERATIVE_KERNEL: CallbackId = 477;
    pub const CU_LAUNCH_COOPERATIVE_KERNEL_PTSZ: CallbackId = 478;
    pub const CU_GRAPH_LAUNCH: CallbackId = 514;
    pub const CU_GRAPH_LAUNCH_PTSZ: CallbackId = 515;
    pub const CU_MEM_ALLOC_ASYNC: CallbackId = 598;
    pub const CU_MEM_ALLOC_ASYNC_PTSZ: CallbackId = 599;
    pub const CU_MEM_FREE_ASYNC: CallbackId = 600;
    pub const CU_MEM_FREE_ASYNC_PTSZ: CallbackId = 601;
    pub const CU_MEM_ALLOC_FROM_POOL_ASYNC: CallbackId = 611;
    pub const CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ: CallbackId = 612;
    pub const CU_LAUNCH_KERNEL_EX: CallbackId = 652;
    pub const CU_LAUNCH_KERNEL_EX_PTSZ: CallbackId = 653;
    /// The kernel launches kreplay replays: `cuLaunchKernel`, `cuLaunchKernelEx`,
    /// `cuLaunchCooperativeKernel` and their per-thread-stream variants.
    pub const LAUNCHES: [CallbackId; 6] = [
        CU_LAUNCH_KERNEL,
        CU_LAUNCH_KERNEL_PTSZ,
        CU_LAUNCH_KERNEL_EX,
        CU_LAUNCH_KERNEL_EX_PTSZ,
        CU_LAUNCH_COOPERATIVE_KERNEL,
        CU_LAUNCH_COOPERATIVE_KERNEL_PTSZ,
    ];
    pub const CU_MEM_CREATE: CallbackId = 549;
    pub const CU_MEM_MAP: CallbackId = 551;
    pub const CU_MEM_UNMAP: CallbackId = 552;
    pub const CU_CTX_ENABLE_PEER_ACCESS: CallbackId = 313;
    pub const CU_MEM_SET_ACCESS: CallbackId = 553;
    pub const CU_MEM_POOL_SET_ACCESS: CallbackId = 605;
    pub const CU_SURF_REF_SET_ARRAY: CallbackId = 194;
    pub const CU_SURF_OBJECT_CREATE: CallbackId = 343;
    pub const CU_SURF_OBJECT_DESTROY: CallbackId = 344;
    pub const CU_IPC_OPEN_MEM_HANDLE: CallbackId = 329;
    pub const CU_IPC_CLOSE_MEM_HANDLE: CallbackId = 330;
    pub const CU_IPC_OPEN_MEM_HANDLE_V2: CallbackId = 567;
    pub const CU_MEM_POOL_IMPORT_POINTER: CallbackId = 616;
    pub const CU_EXTERNAL_MEMORY_GET_MAPPED_BUFFER: CallbackId = 486;
    pub const CU_GRAPHICS_RESOURCE_GET_MAPPED_POINTER_V2: CallbackId = 258;
    pub const CU_GRAPHICS_UNMAP_RESOURCES: CallbackId = 134;
    pub const CU_GRAPHICS_UNMAP_RESOURCES_PTSZ: CallbackId = 444;

    /// Device memory another process or another API shares with this one, and where it ends:
    /// memory opened from another process (`cuIpcOpenMemHandle`, `_v2`; closed by
    /// `cuIpcCloseMemHandle`), a pointer imported from another process's pool
    /// (`cuMemPoolImportPointer`; freed by `cuMemFree`/`cuMemFreeAsync`), a buffer mapped from
    /// external memory (`cuExternalMemoryGetMappedBuffer`, Vulkan or Direct3D; freed by
    /// `cuMemFree`), a graphics resource's mapped pointer
    /// (`cuGraphicsResourceGetMappedPointer_v2`; ended by `cuGraphicsUnmapResources`).
    pub const SHARED: [CallbackId; 8] = [
        CU_IPC_OPEN_MEM_HANDLE,
        CU_IPC_CLOSE_MEM_HANDLE,
        CU_IPC_OPEN_MEM_HANDLE_V2,
        CU_MEM_POOL_IMPORT_POINTER,
        CU_EXTERNAL_MEMORY_GET_MAPPED_BUFFER,
        CU_GRAPHICS_RESOURCE_GET_MAPPED_POINTER_V2,
        CU_GRAPHICS_UNMAP_RESOURCES,
        CU_GRAPHICS_UNMAP_RESOURCES_PTSZ,
    ];

    /// The calls that end memory kreplay tracks, each naming it by its first parameter (a
    /// `CUdeviceptr`): frees, and the close of memory opened from another process. The memory
    /// is forgotten at API ENTER and tracked again as it was at API EXIT when the driver
    /// refused the call.
    pub const FREES: [CallbackId; 4] = [
        CU_MEM_FREE_V2,
        CU_MEM_FREE_ASYNC,
        CU_MEM_FREE_ASYNC_PTSZ,
        CU_IPC_CLOSE_MEM_HANDLE,
    ];

    /// The calls that let kernels write CUDA arrays (surfaces), which kreplay does not snapshot.
    pub const SURFACES: [CallbackId; 3] = [
        CU_SURF_REF_SET_ARRAY,
        CU_SURF_OBJECT_CREATE,
        CU_SURF_OBJECT_DESTROY,
    ];

    pub const CU_STREAM_BEGIN_CAPTURE: CallbackId = 495;
    pub const CU_STREAM_BEGIN_CAPTURE_PTSZ: CallbackId = 496;
    pub const CU_STREAM_END_CAPTURE: CallbackId = 497;
    pub const CU_STREAM_END_CAPTURE_PTSZ: CallbackId = 498;
    pub const CU_STREAM_BEGIN_CAPTURE_V2: CallbackId = 539;
    pub const CU_STREAM_BEGIN_CAPTURE_V2_PTSZ: CallbackId = 540;
    pub const CU_STREAM_BEGIN_CAPTURE_TO_GRAPH: CallbackId = 720;
    pub const CU_STREAM_BEGIN_CAPTURE_TO_GRAPH_PTSZ: CallbackId = 721;

    /// The calls that begin a stream capture (every one's parameters start with the stream).
    pub const BEGIN_CAPTURE: [CallbackId; 6] = [
        CU_STREAM_BEGIN_CAPTURE,
        CU_STREAM_BEGIN_CAPTURE_PTSZ,
        CU_STREAM_BEGIN_CAPTURE_V2,
        CU_STREAM_BEGIN_CAPTURE_V2_PTSZ,
        CU_STREAM_BEGIN_CAPTURE_TO_GRAPH,
        CU_STREAM_BEGIN_CAPTURE_TO_GRAPH_PTSZ,
    ];
    /// The calls that end one.
    pub const END_CAPTURE: [CallbackId; 2] = [CU_STREAM_END_CAPTURE, CU_STREAM_END_CAPTURE_PTSZ];

    /// The calls that let one device's kernels reach another device's memory (peer access:
    /// `cuCtxEnablePeerAccess`, `cuMemSetAccess` on a mapping, `cuMemPoolSetAccess` on a pool),
    /// which link the devices into one replay group (`kreplay_locks::AgentGroups`).
    pub const PEER_ACCESS: [CallbackId; 3] = [
        CU_CTX_ENABLE_PEER_ACCESS,
        CU_MEM_SET_ACCESS,
        CU_MEM_POOL_SET_ACCESS,
    ];

    // Graph memory (see `crate::graphmem`), from CUDA 13.0's `cupti_driver_cbid.h` (the
    // `nvidia-cuda-cupti` 13.0.85 wheel's copy; the same numbers in the CUDA 11 copy the code
    // search finds in iree-org/iree's third_party/cuda/include/cupti_driver_cbid.h, for those it
    // has), with the parameter structs of its `generated_cuda_meta.h`.
    pub const CU_GRAPH_INSTANTIATE: CallbackId = 513;
    pub const CU_GRAPH_EXEC_DESTROY: CallbackId = 516;
    pub const CU_GRAPH_INSTANTIATE_V2: CallbackId = 578;
    pub const CU_GRAPH_ADD_MEM_ALLOC_NODE: CallbackId = 638;
    pub const CU_GRAPH_INSTANTIATE_WITH_FLAGS: CallbackId = 643;
    pub const CU_GRAPH_INSTANTIATE_WITH_PARAMS: CallbackId = 656;
    pub const CU_GRAPH_INSTANTIATE_WITH_PARAMS_PTSZ: CallbackId = 657;
    pub const CU_GRAPH_ADD_NODE: CallbackId = 712;
    pub const CU_GRAPH_ADD_NODE_V2: CallbackId = 723;

    /// The calls that instantiate an executable graph (`cuGraphInstantiate` is
    /// `cuGraphInstantiateWithFlags` in CUDA 12 and 13 headers): every one's parameters start
    /// with `(CUgraphExec *phGraphExec, CUgraph hGraph)`.
    pub const GRAPH_INSTANTIATE: [CallbackId; 5] = [
        CU_GRAPH_INSTANTIATE,
        CU_GRAPH_INSTANTIATE_V2,
        CU_GRAPH_INSTANTIATE_WITH_FLAGS,
        CU_GRAPH_INSTANTIATE_WITH_PARAMS,
        CU_GRAPH_INSTANTIATE_WITH_PARAMS_PTSZ,
    ];

    /// The graph calls kreplay follows for graph memory: allocation nodes added, executable
    /// graphs instantiated and destroyed (launches are in [`SUBSCRIBED`]; free nodes are read
    /// when their graph is instantiated).
    pub const GRAPH_MEMORY: [CallbackId; 9] = [
        CU_GRAPH_INSTANTIATE,
        CU_GRAPH_INSTANTIATE_V2,
        CU_GRAPH_INSTANTIATE_WITH_FLAGS,
        CU_GRAPH_INSTANTIATE_WITH_PARAMS,
        CU_GRAPH_INSTANTIATE_WITH_PARAMS_PTSZ,
        CU_GRAPH_EXEC_DESTROY,
        CU_GRAPH_ADD_MEM_ALLOC_NODE,
        CU_GRAPH_ADD_NODE,
        CU_GRAPH_ADD_NODE_V2,
    ];

    /// The application's calls that take device memory and that kreplay tracks anyway: before
    /// each of these, and of [`TAKE_DEVICE_MEMORY_ONLY`], kreplay gives back the device shadow it
    /// keeps between replays (see `CudaMemory::release_kept_shadow`), so that the application
    /// never runs out of memory because of kreplay ([`takes_device_memory`]).
    pub const TRACKED_TAKING_DEVICE_MEMORY: [CallbackId; 8] = [
        CU_MEM_ALLOC_V2,
        CU_MEM_ALLOC_PITCH_V2,
        CU_MEM_ALLOC_ASYNC,
        CU_MEM_ALLOC_ASYNC_PTSZ,
        CU_MEM_ALLOC_FROM_POOL_ASYNC,
        CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ,
        CU_MEM_CREATE,
        CU_MEM_ALLOC_MANAGED,
    ];

    pub const CU_MODULE_LOAD: CallbackId = 18;
    pub const CU_MODULE_LOAD_DATA: CallbackId = 19;
    pub const CU_MODULE_LOAD_DATA_EX: CallbackId = 20;
    pub const CU_MODULE_LOAD_FAT_BINARY: CallbackId = 21;
    pub const CU_ARRAY_CREATE_V2: CallbackId = 272;
    pub const CU_ARRAY_3D_CREATE_V2: CallbackId = 274;
    pub const CU_MIPMAPPED_ARRAY_CREATE: CallbackId = 347;
    pub const CU_LIBRARY_LOAD_DATA: CallbackId = 678;
    pub const CU_LIBRARY_LOAD_FROM_FILE: CallbackId = 679;

    /// The calls that take device memory enabled for that alone (those of
    /// [`TRACKED_TAKING_DEVICE_MEMORY`] are enabled for their tracking): CUDA arrays (`cuArrayCreate_v2`, `cuArray3DCreate_v2`,
    /// `cuMipmappedArrayCreate`) and the module and library loads, whose globals take device
    /// memory (ids from CUDA 13.0's `cupti_driver_cbid.h`).
    pub const TAKE_DEVICE_MEMORY_ONLY: [CallbackId; 9] = [
        CU_ARRAY_CREATE_V2,
        CU_ARRAY_3D_CREATE_V2,
        CU_MIPMAPPED_ARRAY_CREATE,
        CU_MODULE_LOAD,
        CU_MODULE_LOAD_DATA,
        CU_MODULE_LOAD_DATA_EX,
        CU_MODULE_LOAD_FAT_BINARY,
        CU_LIBRARY_LOAD_DATA,
        CU_LIBRARY_LOAD_FROM_FILE,
    ];

    /// Whether the application's call `id` takes device memory.
    pub fn takes_device_memory(id: CallbackId) -> bool {
        TRACKED_TAKING_DEVICE_MEMORY.contains(&id) || TAKE_DEVICE_MEMORY_ONLY.contains(&id)
    }

    /// Virtual memory management calls kreplay tracks.
    pub const VMM: [CallbackId; 3] = [CU_MEM_CREATE, CU_MEM_MAP, CU_MEM_UNMAP];

    /// Copies fenced against replay windows, every `cuMemcpy*` entry point a 64-bit program
    /// reaches: `cuMemcpy`, `cuMemcpyAsync`, the `_v2` HtoD, DtoH, DtoD (and `Async`), the copies
    /// to, from and between CUDA arrays (AtoD writes device memory, DtoA reads it; HtoA, AtoH and
    /// AtoA change what a kernel reading the array through a texture sees), 2D, 2D unaligned, 3D
    /// (and `Async`), peer copies, the batched copies CUDA 12.8 added (`cuMemcpyBatchAsync`,
    /// `cuMemcpy3DBatchAsync`) and the `_v2` forms CUDA 13's headers map those names to, and
    /// their `_ptds` / `_ptsz` per-thread-stream variants. A batch is fenced on its context's
    /// device as a whole (the fence needs no parameter of the call, so the `_v2` forms' shorter
    /// parameter lists do not matter).
    pub const MEMCPY: [CallbackId; 56] = [
        305, 306, // cuMemcpy, cuMemcpyAsync
        276, 277, 278, 279, 280, 281, // cuMemcpy{HtoD,DtoH,DtoD}{,Async}_v2
        282, 283, 284, 285, 286, // cuMemcpyAtoH{,Async}_v2, cuMemcpy{AtoD,DtoA,AtoA}_v2
        287, 288, 289, 290, 291, // cuMemcpy2D{,Unaligned,Async}_v2, cuMemcpy3D{,Async}_v2
        292, 293, // cuMemcpyHtoA{,Async}_v2
        318, 319, 320, 321, // cuMemcpyPeer{,Async}, cuMemcpy3DPeer{,Async}
        397, 398, 399, 400, 401, 402, 403, 404, 405, 406, 407, 408, 409, 410, // _ptds
        418, 419, 420, 421, 422, 423, 424, 425, 426, 427, // _ptsz
        776, 777, 778, 779, // cuMemcpyBatchAsync{,_ptsz}, cuMemcpy3DBatchAsync{,_ptsz}
        796, 797, 798, 799, // cuMemcpyBatchAsync_v2{,_ptsz}, cuMemcpy3DBatchAsync_v2{,_ptsz}
    ];

    /// Stream memory operations that write device memory when their stream reaches them,
    /// fenced like copies: `cuStreamWriteValue32`, `cuStreamWriteValue64` and
    /// `cuStreamBatchMemOp` (which may hold writes), the first forms and the `_v2` ones CUDA
    /// 12+ headers map those names to, each with its `_ptsz` variant. (`cuStreamWaitValue*`
    /// only waits: see [`STREAM_WAITS`].)
    pub const STREAM_WRITES: [CallbackId; 12] = [
        460, 461, // cuStreamWriteValue32{,_ptsz}
        462, 463, // cuStreamBatchMemOp{,_ptsz}
        475, 476, // cuStreamWriteValue64{,_ptsz}
        663, 664, // cuStreamWriteValue32_v2{,_ptsz}
        665, 666, // cuStreamWriteValue64_v2{,_ptsz}
        667, 668, // cuStreamBatchMemOp_v2{,_ptsz}
    ];

    /// Work queued on a stream that waits, fenced like copies though it writes nothing: queued
    /// on a replayed launch's stream inside its window it would stand before the re-launches,
    /// and what it waits for may be a fenced call waiting for the window. `cuStreamWaitValue32`
    /// and `cuStreamWaitValue64` (first and `_v2` forms), `cuStreamWaitEvent` (the event may
    /// be recorded behind such a wait on another stream), `cuLaunchHostFunc` and
    /// `cuStreamAddCallback` (a host function that waits for the host), each with its `_ptsz`
    /// variant (ids from CUDA 13.0's `cupti_driver_cbid.h`). A wait queued before a window
    /// opens is the drain's: its timeout bounds it.
    pub const STREAM_WAITS: [CallbackId; 14] = [
        458, 459, // cuStreamWaitValue32{,_ptsz}
        473, 474, // cuStreamWaitValue64{,_ptsz}
        659, 660, // cuStreamWaitValue32_v2{,_ptsz}
        661, 662, // cuStreamWaitValue64_v2{,_ptsz}
        295, 436, // cuStreamWaitEvent{,_ptsz}
        527, 528, // cuLaunchHostFunc{,_ptsz}
        346, 437, // cuStreamAddCallback{,_ptsz}
    ];

    /// Kernel launches kreplay does not replay, fenced against every device's replay windows
    /// like a graph launch: the legacy `cuLaunch`, `cuLaunchGrid` and `cuLaunchGridAsync`, and
    /// `cuLaunchCooperativeKernelMultiDevice` (deprecated), whose kernels run once.
    pub const UNREPLAYED_LAUNCHES: [CallbackId; 4] = [
        115, // cuLaunch
        116, // cuLaunchGrid
        117, // cuLaunchGridAsync
        480, // cuLaunchCooperativeKernelMultiDevice
    ];

    /// Memsets fenced against replay windows: `cuMemsetD{8,16,32}` and `cuMemsetD2D{8,16,32}`,
    /// synchronous (`_v2`, `_ptds`) and `Async` (plain and `_ptsz`).
    pub const MEMSET: [CallbackId; 24] = [
        249, 250, 251, 252, 253, 254, // _v2
        216, 218, 220, 222, 224, 226, // Async
        411, 412, 413, 414, 415, 416, // _v2_ptds
        428, 429, 430, 431, 432, 433, // Async_ptsz
    ];

    /// Every callback kreplay enables: [`SUBSCRIBED`], [`VMM`], [`SHARED`], [`PEER_ACCESS`],
    /// [`SURFACES`], [`MEMCPY`], [`MEMSET`], [`STREAM_WRITES`], [`STREAM_WAITS`],
    /// [`UNREPLAYED_LAUNCHES`],
    /// [`BEGIN_CAPTURE`], [`END_CAPTURE`], [`GRAPH_MEMORY`] and [`TAKE_DEVICE_MEMORY_ONLY`].
    pub fn all() -> Vec<CallbackId> {
        [
            &SUBSCRIBED[..],
            &VMM,
            &SHARED,
            &PEER_ACCESS,
            &SURFACES,
            &MEMCPY,
            &MEMSET,
            &STREAM_WRITES,
            &STREAM_WAITS,
            &UNREPLAYED_LAUNCHES,
            &BEGIN_CAPTURE,
            &END_CAPTURE,
            &GRAPH_MEMORY,
            &TAKE_DEVICE_MEMORY_ONLY,
        ]
        .concat()
    }

    /// The allocation, launch and graph callbacks kreplay enables.
    pub const SUBSCRIBED: [CallbackId; 18] = [
        CU_MEM_ALLOC_V2,
        CU_MEM_ALLOC_PITCH_V2,
        CU_MEM_FREE_V2,
        CU_LAUNCH_KERNEL,
        CU_MEM_ALLOC_MANAGED,
        CU_LAUNCH_KERNEL_PTSZ,
        CU_LAUNCH_COOPERATIVE_KERNEL,
        CU_LAUNCH_COOPERATIVE_KERNEL_PTSZ,
        CU_GRAPH_LAUNCH,
        CU_GRAPH_LAUNCH_PTSZ,
        CU_MEM_ALLOC_ASYNC,
        CU_MEM_ALLOC_ASYNC_PTSZ,
        CU_MEM_FREE_ASYNC,
        CU_MEM_FREE_ASYNC_PTSZ,
        CU_MEM_ALLOC_FROM_POOL_ASYNC,
        CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ,
        CU_LAUNCH_KERNEL_EX,
        CU_LAUNCH_KERNEL_EX_PTSZ,
    ];
}

/// `CUpti_CallbackData` (cupti_callbacks.h).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CallbackData {
    /// `CUPTI_API_ENTER` or `CUPTI_API_EXIT`.
    pub callback_site: c_int,
    /// The API function's name.
    pub function_name: *const c_char,
    /// The API call's parameter struct (`<function>_params`).
    pub function_params: *const c_void,
    /// The call's `CUresult` (valid at EXIT).
    pub function_return_value: *const c_void,
    /// The kernel's name for launches.
    pub symbol_name: *const c_char,
    /// The context of the call.
    pub context: CuContext,
    /// Unique id of that context.
    pub context_uid: u32,
    /// Per-call scratch shared by ENTER and EXIT.
    pub correlation_data: *mut u64,
    /// The call's correlation id.
    pub correlation_id: u32,
}

/// `cuLaunchKernel_params` (also `_ptsz`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct LaunchKernelParams {
    pub f: CuFunction,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub stream: CuStream,
    pub kernel_params: *mut *mut c_void,
    pub extra: *mut *mut c_void,
}

/// `cuLaunchKernelEx_params` (also `_ptsz`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct LaunchKernelExParams {
    pub config: *const CuLaunchConfig,
    pub f: CuFunction,
    pub kernel_params: *mut *mut c_void,
    pub extra: *mut *mut c_void,
}

/// `cuLaunchCooperativeKernel_params` (also `_ptsz`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct LaunchCooperativeKernelParams {
    pub f: CuFunction,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub stream: CuStream,
    pub kernel_params: *mut *mut c_void,
}

/// `cuMemAlloc_v2_params`, and the leading fields of `cuMemAllocManaged_params`,
/// `cuMemAllocAsync_params` and `cuMemAllocFromPoolAsync_params`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct MemAllocParams {
    pub dptr: *mut CuDevicePtr,
    pub bytesize: usize,
}

/// `cuMemAllocPitch_v2_params`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct MemAllocPitchParams {
    pub dptr: *mut CuDevicePtr,
    pub pitch: *mut usize,
    pub width_in_bytes: usize,
    pub height: usize,
    pub element_size_bytes: u32,
}

/// `cuMemMap_params`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct MemMapParams {
    pub ptr: CuDevicePtr,
    pub size: usize,
    pub offset: usize,
    pub handle: u64,
    pub flags: u64,
}

/// `cuCtxEnablePeerAccess_params`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct CtxEnablePeerAccessParams {
    pub peer_context: CuContext,
    pub flags: u32,
}

/// `CUmemAccessDesc`: a location (`CUmemLocation`: type, id) and the access it gets.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct MemAccessDesc {
    pub location_type: i32,
    pub location_id: i32,
    pub flags: i32,
}

/// `cuMemSetAccess_params`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct MemSetAccessParams {
    pub ptr: CuDevicePtr,
    pub size: usize,
    pub desc: *const MemAccessDesc,
    pub count: usize,
}

/// `cuMemPoolSetAccess_params`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct MemPoolSetAccessParams {
    pub pool: *mut c_void,
    pub map: *const MemAccessDesc,
    pub count: usize,
}

/// The devices an access list gives any access (`CU_MEM_LOCATION_TYPE_DEVICE` locations whose
/// flags are not `CU_MEM_ACCESS_FLAGS_PROT_NONE`).
pub fn devices_granted(descs: &[MemAccessDesc]) -> Vec<u64> {
    granted_devices(&device_access(descs))
}

/// The devices of an access list as [`device_access`] gives it that are given any access.
pub fn granted_devices(access: &[(u64, i32)]) -> Vec<u64> {
    access
        .iter()
        .filter(|&&(_, flags)| flags != 0)
        .map(|&(device, _)| device)
        .collect()
}

/// Each device an access list names, with its `CUmemAccess_flags`, in the list's order.
pub fn device_access(descs: &[MemAccessDesc]) -> Vec<(u64, i32)> {
    descs
        .iter()
        .filter(|d| d.location_type == crate::tracking::CU_MEM_LOCATION_TYPE_DEVICE)
        .filter_map(|d| Some((u64::try_from(d.location_id).ok()?, d.flags)))
        .collect()
}

/// `cuMemUnmap_params`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct MemUnmapParams {
    pub ptr: CuDevicePtr,
    pub size: usize,
}

/// `cuMemFree_v2_params`, and the leading field of `cuMemFreeAsync_params`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct MemFreeParams {
    pub dptr: CuDevicePtr,
}

/// `cuMemAllocAsync_params` (also `_ptsz`): the stream follows the size.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct MemAllocAsyncParams {
    pub dptr: *mut CuDevicePtr,
    pub bytesize: usize,
    pub stream: CuStream,
}

/// `cuMemAllocFromPoolAsync_params` (also `_ptsz`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct MemAllocFromPoolAsyncParams {
    pub dptr: *mut CuDevicePtr,
    pub bytesize: usize,
    pub pool: *mut c_void,
    pub stream: CuStream,
}

/// `cuMemFreeAsync_params` (also `_ptsz`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct MemFreeAsyncParams {
    pub dptr: CuDevicePtr,
    pub stream: CuStream,
}

/// `CUmemPoolProps` (cuda.h, CUDA 11.2 to 13): how a pool, or a graph allocation node, places
/// its memory.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct MemPoolProps {
    /// `CUmemAllocationType` (`CU_MEM_ALLOCATION_TYPE_PINNED` = 1).
    pub alloc_type: c_int,
    pub handle_types: c_int,
    /// `CUmemLocation::type` (`CU_MEM_LOCATION_TYPE_DEVICE` = 1).
    pub location_type: c_int,
    /// `CUmemLocation::id` (the device ordinal for a device location).
    pub location_id: c_int,
    pub win32_security_attributes: *mut c_void,
    pub max_size: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (`_v1`, and `_v2`, which has the same fields): `dptr` is written
/// by `cuGraphAddMemAllocNode` and `cuGraphMemAllocNodeGetParams`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct MemAllocNodeParams {
    pub pool_props: MemPoolProps,
    pub access_descs: *const MemAccessDesc,
    pub access_desc_count: usize,
    pub bytesize: usize,
    pub dptr: CuDevicePtr,
}

impl MemAllocNodeParams {
    /// The graph allocation these parameters describe (after the driver wrote `dptr`).
    pub fn allocation(&self) -> crate::graphmem::GraphAlloc {
        let p = &self.pool_props;
        crate::graphmem::GraphAlloc {
            base: self.dptr,
            size: self.bytesize as u64,
            place: crate::graphmem::Place::from_pool(p.alloc_type, p.location_type, p.location_id),
        }
    }
}

/// `cuGraphAddMemAllocNode_params`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct GraphAddMemAllocNodeParams {
    pub ph_graph_node: *mut *mut c_void,
    pub graph: *mut c_void,
    pub dependencies: *const *mut c_void,
    pub num_dependencies: usize,
    pub node_params: *mut MemAllocNodeParams,
}

/// `cuGraphAddNode_params`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct GraphAddNodeParams {
    pub ph_graph_node: *mut *mut c_void,
    pub graph: *mut c_void,
    pub dependencies: *const *mut c_void,
    pub num_dependencies: usize,
    pub node_params: *mut GraphNodeParamsHead,
}

/// `cuGraphAddNode_v2_params` (what `cuGraphAddNode` is in CUDA 13 headers).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct GraphAddNodeV2Params {
    pub ph_graph_node: *mut *mut c_void,
    pub graph: *mut c_void,
    pub dependencies: *const *mut c_void,
    pub dependency_data: *const c_void,
    pub num_dependencies: usize,
    pub node_params: *mut GraphNodeParamsHead,
}

/// The head of `CUgraphNodeParams`: its type, then (after `int reserved0[3]`) the union whose
/// `alloc` member is a `CUDA_MEM_ALLOC_NODE_PARAMS_v2` for a `CU_GRAPH_NODE_TYPE_MEM_ALLOC` node.
/// Only read, never made: the struct the application passed is larger (256 bytes, its union
/// 232).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct GraphNodeParamsHead {
    pub node_type: c_int,
    pub reserved0: [c_int; 3],
    pub alloc: MemAllocNodeParams,
}

/// The leading fields of every `cuGraphInstantiate*_params`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct GraphInstantiateParams {
    pub ph_graph_exec: *mut *mut c_void,
    pub graph: *mut c_void,
}

/// `cuGraphInstantiateWithFlags_params`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct GraphInstantiateWithFlagsParams {
    pub ph_graph_exec: *mut *mut c_void,
    pub graph: *mut c_void,
    pub flags: u64,
}

/// `cuGraphInstantiateWithParams_params` (also `_ptsz`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct GraphInstantiateWithParamsParams {
    pub ph_graph_exec: *mut *mut c_void,
    pub graph: *mut c_void,
    pub instantiate_params: *const GraphInstantiateInfo,
}

/// `CUDA_GRAPH_INSTANTIATE_PARAMS`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct GraphInstantiateInfo {
    pub flags: u64,
    pub upload_stream: CuStream,
    pub err_node_out: *mut c_void,
    pub result_out: c_int,
}

/// `cuGraphLaunch_params` (also `_ptsz`), and the leading field of `cuGraphExecDestroy_params`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct GraphLaunchParams {
    pub exec: *mut c_void,
    pub stream: CuStream,
}

/// The instantiation flags a successful `cuGraphInstantiate*` call `id` was given: its `flags`
/// parameter, the `flags` of its `CUDA_GRAPH_INSTANTIATE_PARAMS`, or 0 for the forms without
/// flags.
///
/// # Safety
/// `params` is the parameter struct of driver-API callback `id`, one of
/// [`cbid::GRAPH_INSTANTIATE`].
pub unsafe fn instantiate_flags(id: CallbackId, params: *const c_void) -> u64 {
    match id {
        // SAFETY: cuGraphInstantiateWithFlags_params, per the caller.
        cbid::CU_GRAPH_INSTANTIATE_WITH_FLAGS => unsafe {
            (*(params as *const GraphInstantiateWithFlagsParams)).flags
        },
        cbid::CU_GRAPH_INSTANTIATE_WITH_PARAMS | cbid::CU_GRAPH_INSTANTIATE_WITH_PARAMS_PTSZ => {
            // SAFETY: cuGraphInstantiateWithParams(_ptsz)_params, per the caller; the
            // application's CUDA_GRAPH_INSTANTIATE_PARAMS is alive during its call.
            unsafe {
                let p = *(params as *const GraphInstantiateWithParamsParams);
                p.instantiate_params.as_ref().map_or(0, |i| i.flags)
            }
        }
        _ => 0,
    }
}

/// The parameter structs of `cuIpcOpenMemHandle` (`_v2`), `cuMemPoolImportPointer` and
/// `cuExternalMemoryGetMappedBuffer`: each starts with where the new device pointer is written.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct PointerOutParams {
    pub dptr: *mut CuDevicePtr,
}

/// `cuExternalMemoryGetMappedBuffer_params`: the new pointer, the external memory and the
/// buffer's description (`CUDA_EXTERNAL_MEMORY_BUFFER_DESC`: offset, then size).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct ExternalMemoryGetMappedBufferParams {
    pub dptr: *mut CuDevicePtr,
    pub ext_mem: *mut c_void,
    pub buffer_desc: *const ExternalMemoryBufferDesc,
}

/// `CUDA_EXTERNAL_MEMORY_BUFFER_DESC`, its leading fields.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct ExternalMemoryBufferDesc {
    pub offset: u64,
    pub size: u64,
    pub flags: c_uint,
}

/// `cuGraphicsResourceGetMappedPointer_v2_params`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct GraphicsMappedPointerParams {
    pub dptr: *mut CuDevicePtr,
    pub size: *mut usize,
    pub resource: *mut c_void,
}

/// `cuGraphicsUnmapResources_params` (and `_ptsz`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct GraphicsUnmapParams {
    pub count: c_uint,
    pub resources: *const *mut c_void,
    pub stream: *mut c_void,
}

/// `cuSurfObjectCreate_params`: where the new surface object is written, and its resource.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct SurfObjectCreateParams {
    pub surface: *mut u64,
    pub resource: *const c_void,
}

/// `cuSurfObjectDestroy_params`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct SurfObjectDestroyParams {
    pub surface: u64,
}

/// The leading field of every `cuStreamBeginCapture*_params` and `cuStreamEndCapture*_params`:
/// the stream.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct StreamCaptureParams {
    pub stream: crate::driver::CuStream,
}

/// The CUPTI entry points kreplay calls.
pub struct Cupti {
    _lib: Library,
    /// `cuptiSubscribe`.
    pub subscribe:
        unsafe extern "C" fn(*mut SubscriberHandle, CallbackFunc, *mut c_void) -> CuptiResult,
    /// `cuptiEnableCallback`.
    pub enable_callback:
        unsafe extern "C" fn(u32, SubscriberHandle, CallbackDomain, CallbackId) -> CuptiResult,
    /// `cuptiUnsubscribe`.
    pub unsubscribe: unsafe extern "C" fn(SubscriberHandle) -> CuptiResult,
    /// `cuptiGetResultString`.
    pub result_string: unsafe extern "C" fn(CuptiResult, *mut *const c_char) -> CuptiResult,
}

impl std::fmt::Debug for Cupti {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cupti").finish_non_exhaustive()
    }
}

/// Where libcupti is looked for when `KREPLAY_CUPTI_PATH` names none.
pub const CUPTI_NAMES: [&str; 4] = [
    "libcupti.so.13",
    "libcupti.so",
    "/usr/local/cuda/lib64/libcupti.so",
    "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so",
];

impl Cupti {
    /// Open `path` and resolve the entry points.
    pub fn load_from(path: &str) -> Result<Cupti, String> {
        // SAFETY: loading libcupti runs its initialisers, which have no preconditions on us.
        let lib = unsafe { Library::new(path) }.map_err(|e| format!("cannot load {path}: {e}"))?;
        // SAFETY: each symbol gets the prototype its public header declares; the pointers stay
        // valid while `_lib` is kept in the struct.
        unsafe {
            let subscribe = *lib
                .get(b"cuptiSubscribe\0")
                .map_err(|e| format!("{path}: {e}"))?;
            let enable_callback = *lib
                .get(b"cuptiEnableCallback\0")
                .map_err(|e| format!("{path}: {e}"))?;
            let unsubscribe = *lib
                .get(b"cuptiUnsubscribe\0")
                .map_err(|e| format!("{path}: {e}"))?;
            let result_string = *lib
                .get(b"cuptiGetResultString\0")
                .map_err(|e| format!("{path}: {e}"))?;
            Ok(Cupti {
                _lib: lib,
                subscribe,
                enable_callback,
                unsubscribe,
                result_string,
            })
        }
    }

    /// Open libcupti (`KREPLAY_CUPTI_PATH`, else [`CUPTI_NAMES`]).
    pub fn load() -> Result<Cupti, String> {
        if let Ok(path) = std::env::var("KREPLAY_CUPTI_PATH") {
            return Cupti::load_from(&path);
        }
        let mut notes = Vec::new();
        for name in CUPTI_NAMES {
            match Cupti::load_from(name) {
                Ok(c) => return Ok(c),
                Err(e) => notes.push(e),
            }
        }
        Err(notes.join("; "))
    }

    /// CUPTI's text for a result code.
    pub fn describe(&self, rc: CuptiResult) -> String {
        let mut s: *const c_char = std::ptr::null();
        // SAFETY: writes a pointer to a static string.
        let ok = unsafe { (self.result_string)(rc, &mut s) } == 0 && !s.is_null();
        if ok {
            // SAFETY: a NUL-terminated static string from CUPTI.
            unsafe { std::ffi::CStr::from_ptr(s) }
                .to_string_lossy()
                .into_owned()
        } else {
            format!("CUptiResult {rc}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn peer_access_parameters_have_the_header_layout() {
        // cuda.h: CUmemLocation { CUmemLocationType type; int id; } and
        // CUmemAccessDesc { CUmemLocation location; CUmemAccess_flags flags; }.
        assert_eq!(size_of::<MemAccessDesc>(), 12);
        assert_eq!(offset_of!(MemAccessDesc, flags), 8);
        assert_eq!(offset_of!(MemSetAccessParams, desc), 16);
        assert_eq!(offset_of!(MemSetAccessParams, count), 24);
        assert_eq!(offset_of!(MemPoolSetAccessParams, map), 8);
        assert_eq!(offset_of!(CtxEnablePeerAccessParams, flags), 8);
    }

    /// Read and read-write access to a device link it; no access, or a host location, does not.
    #[test]
    fn only_devices_given_access_are_granted() {
        let desc = |location_type, location_id, flags| MemAccessDesc {
            location_type,
            location_id,
            flags,
        };
        let list = [desc(1, 0, 3), desc(1, 2, 1), desc(1, 3, 0), desc(2, 5, 3)];
        assert_eq!(devices_granted(&list), vec![0, 2]);
        assert_eq!(devices_granted(&[]), Vec::<u64>::new());
    }

    #[test]
    fn callback_data_has_the_header_layout() {
        // Offsets of CUpti_CallbackData on LP64 (checked against cupti_callbacks.h by a C
        // program on the H200 machine, see docs/cuda.md).
        assert_eq!(offset_of!(CallbackData, function_name), 8);
        assert_eq!(offset_of!(CallbackData, function_params), 16);
        assert_eq!(offset_of!(CallbackData, function_return_value), 24);
        assert_eq!(offset_of!(CallbackData, context), 40);
        assert_eq!(offset_of!(CallbackData, context_uid), 48);
        assert_eq!(offset_of!(CallbackData, correlation_data), 56);
        assert_eq!(size_of::<CallbackData>(), 72);
        assert_eq!(offset_of!(LaunchKernelParams, stream), 40);
        assert_eq!(size_of::<LaunchKernelParams>(), 64);
        assert_eq!(size_of::<LaunchKernelExParams>(), 32);
        // cuLaunchCooperativeKernel_params in cuda.h's argument order (the replays of
        // cooperative.cu on the H200 decoded it: grid, stream and arguments as launched).
        assert_eq!(
            offset_of!(LaunchCooperativeKernelParams, shared_mem_bytes),
            32
        );
        assert_eq!(offset_of!(LaunchCooperativeKernelParams, stream), 40);
        assert_eq!(offset_of!(LaunchCooperativeKernelParams, kernel_params), 48);
        assert_eq!(size_of::<LaunchCooperativeKernelParams>(), 56);
        // CUpti_ResourceData (context, a one-pointer union, descriptor) and
        // CUpti_ModuleResourceData (uint32_t id, size_t size, const char *cubin) on LP64.
        assert_eq!(offset_of!(ResourceData, resource_descriptor), 16);
        assert_eq!(size_of::<ResourceData>(), 24);
        assert_eq!(offset_of!(ModuleResourceData, cubin_size), 8);
        assert_eq!(offset_of!(ModuleResourceData, cubin), 16);
        assert_eq!(offset_of!(CuLaunchConfig, stream), 32);
        assert_eq!(size_of::<CuLaunchConfig>(), 56);
        // cuMemMap_params / cuMemUnmap_params as cuda.h's prototypes give them (not yet checked
        // against generated_cuda_meta.h on the H200).
        assert_eq!(offset_of!(MemMapParams, size), 8);
        assert_eq!(offset_of!(MemMapParams, handle), 24);
        assert_eq!(size_of::<MemMapParams>(), 40);
        assert_eq!(size_of::<MemUnmapParams>(), 16);
        // The shared-memory calls' parameter structs, as cuda.h's prototypes give them, and
        // CUDA_EXTERNAL_MEMORY_BUFFER_DESC (offset, size, flags).
        assert_eq!(
            offset_of!(ExternalMemoryGetMappedBufferParams, buffer_desc),
            16
        );
        assert_eq!(offset_of!(ExternalMemoryBufferDesc, size), 8);
        assert_eq!(offset_of!(ExternalMemoryBufferDesc, flags), 16);
        assert_eq!(offset_of!(GraphicsMappedPointerParams, size), 8);
        assert_eq!(offset_of!(GraphicsMappedPointerParams, resource), 16);
        assert_eq!(offset_of!(GraphicsUnmapParams, resources), 8);
        assert_eq!(offset_of!(GraphicsUnmapParams, stream), 16);
        // Graph memory, as CUDA 13.0's cuda.h and generated_cuda_meta.h declare them:
        // CUmemPoolProps is 88 bytes (location at 8, reserved[54] from 34), so in
        // CUDA_MEM_ALLOC_NODE_PARAMS bytesize is at 104 and dptr at 112; CUgraphNodeParams'
        // union starts at 16; the stream of cuMemAllocAsync and cuMemFreeAsync follows the
        // size and the pointer.
        assert_eq!(size_of::<MemPoolProps>(), 88);
        assert_eq!(offset_of!(MemPoolProps, location_type), 8);
        assert_eq!(offset_of!(MemPoolProps, location_id), 12);
        assert_eq!(offset_of!(MemAllocNodeParams, access_descs), 88);
        assert_eq!(offset_of!(MemAllocNodeParams, bytesize), 104);
        assert_eq!(offset_of!(MemAllocNodeParams, dptr), 112);
        assert_eq!(size_of::<MemAllocNodeParams>(), 120);
        assert_eq!(offset_of!(GraphNodeParamsHead, alloc), 16);
        assert_eq!(offset_of!(GraphAddMemAllocNodeParams, node_params), 32);
        assert_eq!(offset_of!(GraphAddNodeParams, node_params), 32);
        assert_eq!(offset_of!(GraphAddNodeV2Params, node_params), 40);
        assert_eq!(offset_of!(GraphInstantiateWithFlagsParams, flags), 16);
        assert_eq!(
            offset_of!(GraphInstantiateWithParamsParams, instantiate_params),
            16
        );
        assert_eq!(size_of::<GraphInstantiateInfo>(), 32);
        assert_eq!(offset_of!(MemAllocAsyncParams, stream), 16);
        assert_eq!(offset_of!(MemAllocFromPoolAsyncParams, stream), 24);
        assert_eq!(offset_of!(MemFreeAsyncParams, stream), 8);
        assert_eq!(offset_of!(GraphLaunchParams, stream), 8);
        // CUmemAllocationProp as cuda.h declares it: location at 8, 32 bytes in all.
        use crate::driver::CuMemAllocationProp;
        assert_eq!(offset_of!(CuMemAllocationProp, location_type), 8);
        assert_eq!(offset_of!(CuMemAllocationProp, location_id), 12);
        assert_eq!(offset_of!(CuMemAllocationProp, alloc_flags), 24);
        assert_eq!(size_of::<CuMemAllocationProp>(), 32);
    }

    /// The flags of each instantiate call as its parameters give them, and the graph
    /// allocation an allocation node's parameters describe (pinned device memory, or not).
    #[test]
    fn graph_memory_parameters_are_read_as_the_headers_lay_them_out() {
        use crate::graphmem::{CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH, Place};
        let mut exec: *mut c_void = std::ptr::null_mut();
        let with_flags = GraphInstantiateWithFlagsParams {
            ph_graph_exec: &raw mut exec,
            graph: std::ptr::null_mut(),
            flags: CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
        };
        let info = GraphInstantiateInfo {
            flags: 3,
            upload_stream: std::ptr::null_mut(),
            err_node_out: std::ptr::null_mut(),
            result_out: 0,
        };
        let with_params = GraphInstantiateWithParamsParams {
            ph_graph_exec: &raw mut exec,
            graph: std::ptr::null_mut(),
            instantiate_params: &raw const info,
        };
        // SAFETY: each a parameter struct of the id it is read as.
        unsafe {
            let flags = |id, p: *const c_void| instantiate_flags(id, p);
            assert_eq!(
                flags(
                    cbid::CU_GRAPH_INSTANTIATE_WITH_FLAGS,
                    (&raw const with_flags).cast()
                ),
                1
            );
            for id in [
                cbid::CU_GRAPH_INSTANTIATE_WITH_PARAMS,
                cbid::CU_GRAPH_INSTANTIATE_WITH_PARAMS_PTSZ,
            ] {
                assert_eq!(flags(id, (&raw const with_params).cast()), 3);
            }
            for id in [cbid::CU_GRAPH_INSTANTIATE, cbid::CU_GRAPH_INSTANTIATE_V2] {
                assert_eq!(flags(id, (&raw const with_flags).cast()), 0);
            }
        }
        let node = |alloc_type, location_type, location_id| MemAllocNodeParams {
            pool_props: MemPoolProps {
                alloc_type,
                handle_types: 0,
                location_type,
                location_id,
                win32_security_attributes: std::ptr::null_mut(),
                max_size: 0,
                usage: 0,
                reserved: [0; 54],
            },
            access_descs: std::ptr::null(),
            access_desc_count: 0,
            bytesize: 4096,
            dptr: 0x7f00_0000_0000,
        };
        let a = node(1, 1, 2).allocation();
        assert_eq!(
            (a.base, a.size, a.place),
            (0x7f00_0000_0000, 4096, Place::Device(2))
        );
        assert!(matches!(node(1, 2, 0).allocation().place, Place::Other(_)));
        assert!(matches!(node(2, 1, 0).allocation().place, Place::Other(_)));
        for id in cbid::GRAPH_INSTANTIATE {
            assert!(cbid::GRAPH_MEMORY.contains(&id));
            assert_eq!(
                crate::fence::device_write(id),
                None,
                "{id} is no fenced call"
            );
        }
    }

    /// Every entry point that takes device memory (an allocation of any kind, a CUDA array, a
    /// module or library whose globals live on the device) is enabled and gives back kreplay's
    /// kept device shadow first.
    #[test]
    fn every_call_that_takes_device_memory_gives_back_the_kept_shadow_first() {
        let calls = [
            ("cuMemAlloc_v2", 243),
            ("cuMemAllocPitch_v2", 244),
            ("cuMemAllocAsync", 598),
            ("cuMemAllocAsync_ptsz", 599),
            ("cuMemAllocFromPoolAsync", 611),
            ("cuMemAllocFromPoolAsync_ptsz", 612),
            ("cuMemCreate", 549),
            ("cuMemAllocManaged", 371),
            ("cuArrayCreate_v2", 272),
            ("cuArray3DCreate_v2", 274),
            ("cuMipmappedArrayCreate", 347),
            ("cuModuleLoad", 18),
            ("cuModuleLoadData", 19),
            ("cuModuleLoadDataEx", 20),
            ("cuModuleLoadFatBinary", 21),
            ("cuLibraryLoadData", 678),
            ("cuLibraryLoadFromFile", 679),
        ];
        let enabled = cbid::all();
        for (name, id) in calls {
            assert!(cbid::takes_device_memory(id), "{name} ({id})");
            assert!(enabled.contains(&id), "{name} ({id}) is not enabled");
        }
        for id in [
            cbid::CU_MEM_FREE_V2,
            cbid::CU_LAUNCH_KERNEL,
            cbid::CU_MEM_MAP,
        ] {
            assert!(!cbid::takes_device_memory(id), "{id}");
        }
    }

    /// The calls that end memory forget it at their API ENTER (no snapshot or restore may copy
    /// it while the driver lets it go) and put it back at their API EXIT when the driver
    /// refused them. `cuIpcCloseMemHandle` forgot memory opened from another process with no
    /// way back: refused (during another thread's capture in global mode, or given a pointer
    /// it does not take), the memory stayed mapped, and a kernel writing it through a pointer
    /// kept in memory had its writes repeated by every pass.
    #[test]
    fn every_call_that_ends_memory_is_undone_when_the_driver_refuses_it() {
        for (name, id) in [
            ("cuMemFree_v2", 245),
            ("cuMemFreeAsync", 600),
            ("cuMemFreeAsync_ptsz", 601),
            ("cuIpcCloseMemHandle", 330),
        ] {
            assert!(cbid::FREES.contains(&id), "{name} ({id})");
            assert!(cbid::all().contains(&id), "{name} ({id}) is not enabled");
        }
    }

    /// The calls that end a tracked object other than memory (an executable graph, a surface
    /// object, a graphics mapping) forget it at API ENTER too, and their API EXIT, which must
    /// be subscribed, puts it back when the driver refused them.
    #[test]
    fn every_call_that_ends_a_tracked_object_is_seen_at_its_exit() {
        for id in [
            cbid::CU_GRAPH_EXEC_DESTROY,
            cbid::CU_SURF_OBJECT_DESTROY,
            cbid::CU_GRAPHICS_UNMAP_RESOURCES,
            cbid::CU_GRAPHICS_UNMAP_RESOURCES_PTSZ,
        ] {
            assert!(cbid::all().contains(&id), "{id} is not enabled");
        }
    }

    #[test]
    fn subscribed_ids_are_distinct() {
        let mut ids = cbid::all();
        let n = ids.len();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), n);
    }

    #[test]
    fn a_missing_cupti_is_a_clear_error() {
        let err = Cupti::load_from("/nonexistent/libcupti.so").unwrap_err();
        assert!(err.contains("/nonexistent/libcupti.so"), "{err}");
    }
}
