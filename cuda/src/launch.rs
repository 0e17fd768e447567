//! A kernel launch as the driver API received it, and how it maps onto kreplay's dispatch info.

use std::ffi::{c_int, c_void};

use kreplay_passloop::DispatchInfo;

use crate::drainer::Drainer;
use crate::driver::{
    CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
    CU_STREAM_CAPTURE_STATUS_NONE, CU_STREAM_PER_THREAD, CuContext, CuFunction, CuLaunchConfig,
    CuStream, Driver,
};
use crate::window::LaunchOps;

/// Which entry point submitted the launch (and so how to submit it again).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaunchApi {
    /// `cuLaunchKernel`.
    Kernel,
    /// `cuLaunchKernelEx`, with the application's `CUlaunchConfig` (attributes included).
    KernelEx {
        /// The application's configuration, valid until the call returns.
        config: *const CuLaunchConfig,
    },
    /// `cuLaunchCooperativeKernel`: every block of the grid resident at once, so the kernel
    /// may synchronise the whole grid (it takes no `extra`).
    Cooperative,
}

/// One launch, with the application's parameter pointers (valid between the launch's API ENTER
/// and EXIT, which is exactly when kreplay uses them).
#[derive(Clone, Copy, Debug)]
pub struct Launch {
    /// The context current at the launch.
    pub ctx: CuContext,
    /// The device ordinal of that context.
    pub device: i32,
    /// Which entry point.
    pub api: LaunchApi,
    /// Whether the per-thread default stream variant (`_ptsz`) was called.
    pub per_thread: bool,
    /// The kernel.
    pub function: CuFunction,
    /// Grid size in blocks.
    pub grid: [u32; 3],
    /// Block size in threads.
    pub block: [u32; 3],
    /// Dynamic shared memory per block.
    pub shared_mem_bytes: u32,
    /// The stream as the application named it.
    pub stream: CuStream,
    /// `kernelParams`.
    pub params: *mut *mut c_void,
    /// `extra`.
    pub extra: *mut *mut c_void,
}

impl Launch {
    /// The stream the launch really runs on: a null stream of a `_ptsz` call is the calling
    /// thread's default stream.
    pub fn effective_stream(&self) -> CuStream {
        if self.per_thread && self.stream.is_null() {
            CU_STREAM_PER_THREAD as CuStream
        } else {
            self.stream
        }
    }

    /// The dispatch info of this launch (see docs/cuda.md for the mapping): agent = device
    /// ordinal, queue = stream handle, kernel = `CUfunction`, grid in work-items (threads,
    /// saturating at `u32::MAX`), work-group = block, group segment = static plus dynamic
    /// shared memory, private segment = local memory per thread. The two function attributes
    /// are read through `attribute` (0 when unavailable).
    pub fn dispatch_info(
        &self,
        dispatch_id: u64,
        attribute: impl Fn(c_int) -> Option<i32>,
    ) -> DispatchInfo {
        let grid = std::array::from_fn(|i| {
            u32::try_from(u64::from(self.grid[i]) * u64::from(self.block[i])).unwrap_or(u32::MAX)
        });
        let attr = |a| {
            attribute(a)
                .and_then(|v| u32::try_from(v).ok())
                .unwrap_or(0)
        };
        DispatchInfo {
            agent_id: self.device as u64,
            queue_id: self.effective_stream() as u64,
            kernel_id: self.function as u64,
            dispatch_id,
            private_segment_size: attr(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES),
            group_segment_size: attr(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
                .saturating_add(self.shared_mem_bytes),
            workgroup_size: self.block,
            grid_size: grid,
        }
    }
}

/// [`LaunchOps`] of a real launch.
#[derive(Debug)]
pub struct CudaLaunch<'a> {
    /// The driver.
    pub driver: &'a Driver,
    /// The launch.
    pub launch: Launch,
    /// Drains with a timeout on kreplay's drain thread (see [`crate::drainer`]); `None`
    /// synchronizes on the calling thread (kreplay's own programs, whose devices run nothing
    /// else).
    pub drainer: Option<&'a Drainer>,
}

impl CudaLaunch<'_> {
    /// Read a function attribute of the launch's kernel.
    pub fn attribute(&self, attr: c_int) -> Option<i32> {
        let mut v: c_int = 0;
        // SAFETY: the function handle is the one the application is launching (alive), and
        // the call writes one int.
        let rc = unsafe { (self.driver.func_get_attribute)(&mut v, attr, self.launch.function) };
        (rc == crate::driver::CUDA_SUCCESS).then_some(v)
    }
}

impl LaunchOps for CudaLaunch<'_> {
    fn replayable(&self) -> Result<(), String> {
        let d = self.driver;
        let mut status: c_int = CU_STREAM_CAPTURE_STATUS_NONE;
        let f = if self.launch.per_thread {
            d.stream_is_capturing_ptsz
        } else {
            d.stream_is_capturing
        };
        // SAFETY: the stream is the application's launch stream (alive during the call).
        let rc = unsafe { f(self.launch.stream, &mut status) };
        d.check("cuStreamIsCapturing", rc)
            .map_err(|e| e.to_string())?;
        if status != CU_STREAM_CAPTURE_STATUS_NONE {
            return Err("the launch is being captured into a graph".into());
        }
        Ok(())
    }

    fn drain(&self) -> Result<(), String> {
        if let Some(drainer) = self.drainer {
            return drainer.drain(self.launch.ctx as usize);
        }
        let d = self.driver;
        // SAFETY: the context of the launch in progress.
        unsafe { d.make_current(self.launch.ctx) }.map_err(|e| e.to_string())?;
        // SAFETY: synchronizes the current context: every stream of the device (one context
        // per device, as the runtime API and PyTorch use). Never while a stream of the device
        // is being captured (the window asks `drainable` first, see `crate::capture`): that
        // would invalidate the capture.
        d.check("cuCtxSynchronize", unsafe { (d.ctx_synchronize)() })
            .map_err(|e| e.to_string())
    }

    fn wait(&self) -> Result<(), String> {
        let d = self.driver;
        let f = if self.launch.per_thread {
            d.stream_synchronize_ptsz
        } else {
            d.stream_synchronize
        };
        // SAFETY: the application's launch stream, alive during the launch call.
        d.check("cuStreamSynchronize", unsafe { f(self.launch.stream) })
            .map_err(|e| e.to_string())
    }

    fn relaunch(&self) -> Result<(), String> {
        let d = self.driver;
        let l = &self.launch;
        let rc = match l.api {
            LaunchApi::Kernel => {
                let f = if l.per_thread {
                    d.launch_kernel_ptsz
                } else {
                    d.launch_kernel
                };
                // SAFETY: exactly the arguments the application passed to this entry point,
                // whose pointers stay valid until its call returns (we are inside it).
                unsafe {
                    f(
                        l.function,
                        l.grid[0],
                        l.grid[1],
                        l.grid[2],
                        l.block[0],
                        l.block[1],
                        l.block[2],
                        l.shared_mem_bytes,
                        l.stream,
                        l.params,
                        l.extra,
                    )
                }
            }
            LaunchApi::KernelEx { config } => {
                let f = if l.per_thread {
                    d.launch_kernel_ex_ptsz
                } else {
                    d.launch_kernel_ex
                };
                let f = f.ok_or("this driver has no cuLaunchKernelEx")?;
                // SAFETY: as above, the application's own configuration and parameters.
                unsafe { f(config, l.function, l.params, l.extra) }
            }
            LaunchApi::Cooperative => {
                let f = if l.per_thread {
                    d.launch_cooperative_kernel_ptsz
                } else {
                    d.launch_cooperative_kernel
                };
                let f = f.ok_or("this driver has no cuLaunchCooperativeKernel")?;
                // SAFETY: as above, the arguments the application passed to this entry point.
                // The grid fitted the device when the application's launch was accepted, and
                // nothing else of the application runs on the device while the window is open.
                unsafe {
                    f(
                        l.function,
                        l.grid[0],
                        l.grid[1],
                        l.grid[2],
                        l.block[0],
                        l.block[1],
                        l.block[2],
                        l.shared_mem_bytes,
                        l.stream,
                        l.params,
                    )
                }
            }
        };
        let call = match l.api {
            LaunchApi::Kernel => "cuLaunchKernel",
            LaunchApi::KernelEx { .. } => "cuLaunchKernelEx",
            LaunchApi::Cooperative => "cuLaunchCooperativeKernel",
        };
        d.check(call, rc).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(grid: [u32; 3], block: [u32; 3]) -> Launch {
        Launch {
            ctx: std::ptr::null_mut(),
            device: 3,
            api: LaunchApi::Kernel,
            per_thread: false,
            function: 0x1234 as CuFunction,
            grid,
            block,
            shared_mem_bytes: 256,
            stream: 0x77 as CuStream,
            params: std::ptr::null_mut(),
            extra: std::ptr::null_mut(),
        }
    }

    #[test]
    fn dispatch_info_counts_the_grid_in_threads_and_adds_static_shared_memory() {
        let info = launch([10, 2, 1], [128, 4, 1]).dispatch_info(9, |a| match a {
            CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES => Some(1024),
            CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES => Some(48),
            _ => None,
        });
        assert_eq!(info.agent_id, 3);
        assert_eq!(info.queue_id, 0x77);
        assert_eq!(info.kernel_id, 0x1234);
        assert_eq!(info.dispatch_id, 9);
        assert_eq!(info.grid_size, [1280, 8, 1]);
        assert_eq!(info.workgroup_size, [128, 4, 1]);
        assert_eq!(info.group_segment_size, 1024 + 256);
        assert_eq!(info.private_segment_size, 48);
    }

    #[test]
    fn grids_beyond_u32_threads_saturate_instead_of_wrapping() {
        let info = launch([u32::MAX / 2, 1, 1], [1024, 1, 1]).dispatch_info(0, |_| None);
        assert_eq!(info.grid_size[0], u32::MAX);
        assert_eq!(info.private_segment_size, 0);
    }

    #[test]
    fn a_null_stream_of_a_per_thread_call_is_the_per_thread_default_stream() {
        let mut l = launch([1, 1, 1], [1, 1, 1]);
        l.stream = std::ptr::null_mut();
        assert!(l.effective_stream().is_null(), "legacy default stream");
        l.per_thread = true;
        assert_eq!(l.effective_stream() as usize, CU_STREAM_PER_THREAD);
    }
}
