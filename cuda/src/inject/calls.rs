//! The driver-API callback's work per call: fences, tracking and launches.

use super::*;

impl Backend {
    /// One driver-API callback.
    ///
    /// # Safety
    /// `data` is the `CUpti_CallbackData` CUPTI passes for a driver-API callback of `id`.
    pub(super) unsafe fn handle(&self, id: CallbackId, data: &CallbackData) {
        let enter = data.callback_site == API_ENTER;
        let exit = data.callback_site == API_EXIT;
        // SAFETY: at EXIT, function_return_value points to the call's CUresult.
        let result = || unsafe { *(data.function_return_value as *const CuResult) };
        let params = data.function_params;
        if let Some(write) = fence::device_write(id) {
            // No fenced call is one of the calls handled below.
            let graph = (write == fence::DeviceWrite::Graph).then(|| {
                // SAFETY: cuGraphLaunch(_ptsz)_params starts with the executable graph.
                unsafe { (*(params as *const GraphLaunchParams)).exec as usize }
            });
            if enter {
                self.note_unreplayed(write, data.context);
                if graph.is_some_and(|exec| self.graphs.allocates(exec)) {
                    // Its allocations take memory now: as before any allocation, kreplay's
                    // kept shadow makes room.
                    self.before_app_alloc(data.context);
                }
                let devices = self.fenced_devices(id, data);
                fence::enter(&self.locks, &devices);
            } else if exit {
                if let Some(exec) = graph
                    && result() == CUDA_SUCCESS
                {
                    // Before the reader side is given back: no replay window on the device
                    // snapshots while the graph's allocations become tracked memory.
                    self.on_graph_launched(exec, data.context);
                }
                fence::exit();
            }
            return;
        }
        // A call that may link devices into one replay group waits for the open windows of
        // every device that may have one, and holds new ones off until the link is recorded at
        // its API EXIT (below), so that a window never holds only part of a group.
        let linking = fence::links_devices(id);
        if linking && enter {
            fence::enter(&self.locks, &self.linking_devices(data.context));
        }
        let _linked = (linking && exit).then_some(fence::ExitOnDrop);
        if enter && cbid::takes_device_memory(id) {
            self.before_app_alloc(data.context);
        }
        match id {
            cbid::CU_MEM_ALLOC_V2
            | cbid::CU_MEM_ALLOC_ASYNC
            | cbid::CU_MEM_ALLOC_ASYNC_PTSZ
            | cbid::CU_MEM_ALLOC_FROM_POOL_ASYNC
            | cbid::CU_MEM_ALLOC_FROM_POOL_ASYNC_PTSZ
                if exit && result() == CUDA_SUCCESS =>
            {
                // SAFETY: these calls' parameter structs start with (CUdeviceptr*, size_t), and
                // on success *dptr holds the new allocation.
                let (base, size) = unsafe {
                    let p = &*(params as *const MemAllocParams);
                    (*p.dptr, p.bytesize as u64)
                };
                if id == cbid::CU_MEM_ALLOC_V2 {
                    self.contexts.note_allocation(data.context as usize, base);
                }
                // SAFETY: `params` is this call's parameter struct.
                let stream = unsafe { async_stream(id, params) };
                match stream {
                    Some((stream, per_thread))
                        if self.captured(stream, per_thread, data.context) =>
                    {
                        self.on_captured_alloc(data.context, base, size);
                    }
                    _ => self.on_alloc(id, data.context, base, size, "cuMemAlloc"),
                }
            }
            cbid::CU_MEM_ALLOC_PITCH_V2 if exit && result() == CUDA_SUCCESS => {
                // SAFETY: cuMemAllocPitch_v2_params; on success both out-pointers are set.
                let (base, size) = unsafe {
                    let p = &*(params as *const MemAllocPitchParams);
                    (*p.dptr, (*p.pitch as u64).saturating_mul(p.height as u64))
                };
                self.contexts.note_allocation(data.context as usize, base);
                self.on_alloc(id, data.context, base, size, "cuMemAllocPitch");
            }
            id if cbid::FREES.contains(&id) && enter => {
                // SAFETY: these parameter structs start with the CUdeviceptr being freed (or
                // closed).
                let base = unsafe { (*(params as *const MemFreeParams)).dptr };
                if matches!(id, cbid::CU_MEM_FREE_ASYNC | cbid::CU_MEM_FREE_ASYNC_PTSZ) {
                    // SAFETY: cuMemFreeAsync(_ptsz)_params.
                    let stream = unsafe { (*(params as *const MemFreeAsyncParams)).stream };
                    let per_thread = id == cbid::CU_MEM_FREE_ASYNC_PTSZ;
                    if self.captured(stream, per_thread, data.context) {
                        // A free node of the graph being captured: the memory stays until a
                        // graph holding the node is launched (read at its instantiation).
                        log(
                            LogLevel::Debug,
                            format!("cuMemFreeAsync of {base:#x} captured into a graph"),
                        );
                        return;
                    }
                }
                let owner = self.contexts.note_free_in(base);
                let freed = self.on_app_free(base);
                if let (Freed::Tracked(f), Some(owner)) = (&freed, owner)
                    && f.reference
                {
                    // Shared memory with references left: it still ends with its context.
                    self.contexts.note_allocation(owner.ctx, base);
                }
                self.frees.enter(base, (freed, owner));
            }
            id if cbid::FREES.contains(&id) && exit => {
                // SAFETY: as at ENTER, the CUdeviceptr being freed.
                let base = unsafe { (*(params as *const MemFreeParams)).dptr };
                self.free_exit(base, result());
            }
            cbid::CU_GRAPH_ADD_MEM_ALLOC_NODE if exit && result() == CUDA_SUCCESS => {
                // SAFETY: cuGraphAddMemAllocNode_params; on success the driver wrote the
                // allocation's address into the application's nodeParams, alive during its call.
                let node = unsafe {
                    let p = *(params as *const GraphAddMemAllocNodeParams);
                    p.node_params.as_ref().copied()
                };
                if let Some(node) = node {
                    // SAFETY: the node's access list, `access_desc_count` entries, alive during
                    // the call.
                    let peers = unsafe { granted(node.access_descs, node.access_desc_count) };
                    self.on_graph_alloc_node(node.allocation(), &peers, "cuGraphAddMemAllocNode");
                }
            }
            cbid::CU_GRAPH_ADD_NODE | cbid::CU_GRAPH_ADD_NODE_V2
                if exit && result() == CUDA_SUCCESS =>
            {
                // SAFETY: cuGraphAddNode(_v2)_params; nodeParams points to the application's
                // CUgraphNodeParams (256 bytes), alive during its call, whose head is read.
                let node = unsafe {
                    let head = if id == cbid::CU_GRAPH_ADD_NODE {
                        (*(params as *const GraphAddNodeParams)).node_params
                    } else {
                        (*(params as *const GraphAddNodeV2Params)).node_params
                    };
                    head.as_ref()
                        .filter(|h| h.node_type == CU_GRAPH_NODE_TYPE_MEM_ALLOC)
                        .map(|h| h.alloc)
                };
                if let Some(node) = node {
                    // SAFETY: as above, the node's access list.
                    let peers = unsafe { granted(node.access_descs, node.access_desc_count) };
                    self.on_graph_alloc_node(node.allocation(), &peers, "cuGraphAddNode");
                }
            }
            id if cbid::GRAPH_INSTANTIATE.contains(&id) && exit && result() == CUDA_SUCCESS => {
                // SAFETY: every cuGraphInstantiate*_params starts with (CUgraphExec *, CUgraph);
                // on success the executable graph was written.
                let (exec, graph) = unsafe {
                    let p = *(params as *const GraphInstantiateParams);
                    (p.ph_graph_exec.as_ref().copied(), p.graph)
                };
                // SAFETY: the parameter struct of instantiate call `id`.
                let flags = unsafe { cupti::instantiate_flags(id, params) };
                if let Some(exec) = exec {
                    self.on_graph_instantiated(exec as usize, graph as usize, flags);
                }
            }
            cbid::CU_GRAPH_EXEC_DESTROY => {
                // SAFETY: cuGraphExecDestroy_params is the executable graph.
                let exec = unsafe { (*(params as *const GraphLaunchParams)).exec } as usize;
                // Forgotten at ENTER (the driver may hand the handle to another thread's next
                // instantiation once it destroyed it), tracked again at the EXIT of a destroy
                // it refused: that graph is still live, and its launches still allocate
                // (unless another thread's destroy of it succeeded meanwhile, see `InFlight`).
                if enter {
                    let destroyed = self.graphs.exec_destroy_enter(exec);
                    self.exec_destroys.enter(exec as u64, destroyed);
                } else if exit {
                    let exited = self
                        .exec_destroys
                        .exit(exec as u64, result() == CUDA_SUCCESS);
                    for destroyed in exited.back.into_iter().flatten() {
                        if self.graphs.exec_destroy_failed(destroyed) {
                            log(
                                LogLevel::Debug,
                                format!(
                                    "cuGraphExecDestroy of {exec:#x} failed: it is tracked again"
                                ),
                            );
                        }
                    }
                }
            }
            cbid::CU_MEM_ALLOC_MANAGED if exit && result() == CUDA_SUCCESS => {
                // SAFETY: cuMemAllocManaged_params starts with (CUdeviceptr*, size_t); on
                // success *dptr holds the new allocation.
                let (base, size) = unsafe {
                    let p = &*(params as *const MemAllocParams);
                    (*p.dptr, p.bytesize as u64)
                };
                self.watch.on_managed_alloc(base, size);
                self.contexts.note_allocation(data.context as usize, base);
                self.stats.managed.fetch_add(1, Ordering::Relaxed);
                if !self.warned_managed.swap(true, Ordering::Relaxed) {
                    log(
                        LogLevel::Warn,
                        "managed memory (cuMemAllocManaged) is not snapshotted: launches run \
                         once, declined as untracked_memory, while managed memory is allocated",
                    );
                }
            }
            cbid::CU_CTX_ENABLE_PEER_ACCESS if exit && result() == CUDA_SUCCESS => {
                // SAFETY: cuCtxEnablePeerAccess_params.
                let peer = unsafe { (*(params as *const CtxEnablePeerAccessParams)).peer_context };
                let devices = [self.ordinal(data.context), self.context_ordinal(peer)];
                if let [Some(a), Some(b)] = devices {
                    self.link_devices(&[a as u64, b as u64], "cuCtxEnablePeerAccess");
                }
            }
            cbid::CU_MEM_SET_ACCESS if exit && result() == CUDA_SUCCESS => {
                // SAFETY: cuMemSetAccess_params, its access list `count` entries long.
                let (ptr, size, access) = unsafe {
                    let p = *(params as *const MemSetAccessParams);
                    (p.ptr, p.size as u64, access_list(p.desc, p.count))
                };
                let mut devices = cupti::granted_devices(&access);
                // The mappings whose own device may now write them are snapshotted from here
                // on (and the ones it no longer may, not).
                let (entered, left) = self
                    .watch
                    .record_access(&self.inventory, ptr, size, &access);
                let said = [
                    (entered, "is snapshotted"),
                    (left, "is no longer writable by its device, not snapshotted"),
                ];
                for (bases, what) in said {
                    for base in bases {
                        log(
                            LogLevel::Debug,
                            format!("cuMemSetAccess: mapping at {base:#x} {what}"),
                        );
                    }
                }
                // The mapping's own device (its handle's, as tracked), or where it is not
                // tracked the calling context's: one of them holds the memory.
                match self.watch.mapping_device(ptr) {
                    Some(d) => devices.push(d as u64),
                    None => devices.extend(self.ordinal(data.context).map(|o| o as u64)),
                }
                self.link_devices(&devices, "cuMemSetAccess");
            }
            cbid::CU_MEM_POOL_SET_ACCESS if exit && result() == CUDA_SUCCESS => {
                // SAFETY: cuMemPoolSetAccess_params, its access list `count` entries long.
                let mut devices = unsafe {
                    let p = *(params as *const MemPoolSetAccessParams);
                    granted(p.map, p.count)
                };
                if !devices.is_empty() {
                    // The pool's own device is not in the call: every device kreplay knows is
                    // linked with the ones granted (more waiting, never a missed writer).
                    devices.extend(self.known_devices());
                    devices.extend(self.ordinal(data.context).map(|o| o as u64));
                }
                self.link_devices(&devices, "cuMemPoolSetAccess");
            }
            cbid::CU_SURF_OBJECT_CREATE if exit && result() == CUDA_SUCCESS => {
                // SAFETY: cuSurfObjectCreate_params; on success *pSurfObject holds the new
                // surface object.
                let handle = unsafe {
                    let p = &*(params as *const SurfObjectCreateParams);
                    (!p.surface.is_null()).then(|| *p.surface)
                };
                if let Some(handle) = handle {
                    self.watch.on_surface_created(handle, data.context as usize);
                    self.warn_surfaces();
                }
            }
            cbid::CU_SURF_OBJECT_DESTROY => {
                // SAFETY: cuSurfObjectDestroy_params.
                let handle = unsafe { (*(params as *const SurfObjectDestroyParams)).surface };
                // As a graph's destroy: forgotten at ENTER, live again if the driver refused.
                if enter {
                    let destroyed = self.watch.surface_destroy_enter(handle);
                    self.surface_destroys.enter(handle, destroyed);
                } else if exit {
                    let exited = self.surface_destroys.exit(handle, result() == CUDA_SUCCESS);
                    for destroyed in exited.back.into_iter().flatten() {
                        if self.watch.surface_destroy_failed(destroyed) {
                            log(
                                LogLevel::Debug,
                                format!(
                                    "cuSurfObjectDestroy of {handle:#x} failed: launches in its \
                                     context run once again while it is live"
                                ),
                            );
                        }
                    }
                }
            }
            cbid::CU_SURF_REF_SET_ARRAY if exit && result() == CUDA_SUCCESS => {
                self.watch.on_surface_reference_bound(data.context as usize);
                self.warn_surfaces();
            }
            cbid::CU_IPC_OPEN_MEM_HANDLE
            | cbid::CU_IPC_OPEN_MEM_HANDLE_V2
            | cbid::CU_MEM_POOL_IMPORT_POINTER
                if exit && result() == CUDA_SUCCESS =>
            {
                // SAFETY: these calls' parameter structs start with the out-pointer of the new
                // device pointer, written on success.
                let base = unsafe { *(*(params as *const PointerOutParams)).dptr };
                let what = if id == cbid::CU_MEM_POOL_IMPORT_POINTER {
                    "cuMemPoolImportPointer"
                } else {
                    "cuIpcOpenMemHandle"
                };
                self.on_shared(data.context, base, None, what);
            }
            cbid::CU_EXTERNAL_MEMORY_GET_MAPPED_BUFFER if exit && result() == CUDA_SUCCESS => {
                // SAFETY: cuExternalMemoryGetMappedBuffer_params; on success *devPtr is set, and
                // the buffer description the application passed is alive during the call.
                let (base, size) = unsafe {
                    let p = &*(params as *const ExternalMemoryGetMappedBufferParams);
                    (*p.dptr, p.buffer_desc.as_ref().map(|d| d.size))
                };
                self.on_shared(data.context, base, size, "cuExternalMemoryGetMappedBuffer");
            }
            cbid::CU_GRAPHICS_RESOURCE_GET_MAPPED_POINTER_V2
                if exit && result() == CUDA_SUCCESS =>
            {
                // SAFETY: cuGraphicsResourceGetMappedPointer_v2_params; on success the pointer
                // is set, and the size too where the application asked for it.
                let (base, size, resource) = unsafe {
                    let p = &*(params as *const GraphicsMappedPointerParams);
                    (
                        *p.dptr,
                        p.size.as_ref().map(|&n| n as u64),
                        p.resource as usize,
                    )
                };
                // Asked again for the same mapping: nothing new. A mapping that moved ends
                // the old one.
                match self.watch.on_graphics_unmapped(resource) {
                    Some(old) if old == base => {}
                    old => {
                        if let Some(old) = old {
                            self.on_shared_end(old);
                        }
                        self.on_shared(
                            data.context,
                            base,
                            size,
                            "cuGraphicsResourceGetMappedPointer",
                        );
                    }
                }
                self.watch.on_graphics_mapped(resource, base);
            }
            cbid::CU_GRAPHICS_UNMAP_RESOURCES | cbid::CU_GRAPHICS_UNMAP_RESOURCES_PTSZ => {
                // SAFETY: cuGraphicsUnmapResources_params, its resource array `count` long.
                let resources: Vec<usize> = unsafe {
                    let p = &*(params as *const GraphicsUnmapParams);
                    if p.resources.is_null() {
                        Vec::new()
                    } else {
                        std::slice::from_raw_parts(p.resources, p.count as usize)
                            .iter()
                            .map(|&r| r as usize)
                            .collect()
                    }
                };
                // Ended at ENTER, as a free: the driver unmaps the memory during the call, and
                // no snapshot may copy it from then on. Mapped again at the EXIT of an unmap
                // the driver refused (a resource not mapped): none of them was unmapped. Kept
                // per resource, so that two threads unmapping one resource at once (in arrays of
                // their own) are told apart as two frees of one address are (`InFlight`).
                if enter {
                    for &resource in &resources {
                        let unmapped = self
                            .watch
                            .graphics_unmap_enter(&self.inventory, &[resource]);
                        let owners = unmapped
                            .ended()
                            .map(|(base, reference, tracked)| {
                                let owner = self.contexts.note_free_in(base);
                                if let (true, Some(owner)) = (reference, owner) {
                                    // References left: it still ends with its context.
                                    self.contexts.note_allocation(owner.ctx, base);
                                }
                                if tracked {
                                    self.stats.frees.fetch_add(1, Ordering::Relaxed);
                                }
                                (base, owner)
                            })
                            .collect();
                        self.graphics_unmaps
                            .enter(resource as u64, (unmapped, owners));
                    }
                } else if exit {
                    let exited = resources.iter().flat_map(|&resource| {
                        let ok = result() == CUDA_SUCCESS;
                        self.graphics_unmaps.exit(resource as u64, ok).back
                    });
                    for (unmapped, owners) in exited {
                        if owners
                            .iter()
                            .any(|(_, o)| o.is_some_and(|o| self.contexts.ended_since(&o)))
                        {
                            // Its context ended meanwhile, and the memory with it (a record
                            // holds one resource's pointer).
                            continue;
                        }
                        for base in self.watch.graphics_unmap_failed(&self.inventory, unmapped) {
                            if let Some(&(_, Some(owner))) = owners.iter().find(|(b, _)| *b == base)
                            {
                                self.contexts.note_allocation(owner.ctx, base);
                            }
                            log(
                                LogLevel::Debug,
                                format!(
                                    "cuGraphicsUnmapResources failed: the memory at {base:#x} \
                                     is tracked again"
                                ),
                            );
                        }
                    }
                }
            }
            cbid::CU_MEM_MAP if exit && result() == CUDA_SUCCESS => {
                // SAFETY: cuMemMap_params.
                let p = unsafe { *(params as *const MemMapParams) };
                // The handle is still valid at the call's EXIT (the application releases it
                // afterwards, if at all); its location names the device, whatever context is
                // current.
                let location = self.driver.handle_location(p.handle);
                match self
                    .watch
                    .record_map(&self.inventory, p.ptr, p.size as u64, location)
                {
                    Ok(ordinal) => {
                        self.stats.allocations.fetch_add(1, Ordering::Relaxed);
                        log(
                            LogLevel::Debug,
                            format!(
                                "cuMemMap {} bytes at {:#x} on device {ordinal}",
                                p.size, p.ptr
                            ),
                        );
                    }
                    Err(why) => log(
                        LogLevel::Warn,
                        format!(
                            "cuMemMap of {} bytes at {:#x}: {why}; launches run once while it is \
                             mapped",
                            p.size, p.ptr
                        ),
                    ),
                }
            }
            cbid::CU_MEM_UNMAP if enter => {
                // SAFETY: cuMemUnmap_params.
                let p = unsafe { *(params as *const MemUnmapParams) };
                let (out, mut undo) = self.watch.unmap_enter(p.ptr, p.size as u64);
                for base in out.removed {
                    undo.allocations.extend(self.on_free(base));
                }
                // By its range: an unmap overlapping it on another thread names the same
                // mappings (see `InFlight`).
                self.unmaps.enter_range(p.ptr, p.size as u64, undo);
            }
            cbid::CU_MEM_UNMAP if exit => {
                // SAFETY: cuMemUnmap_params.
                let p = unsafe { *(params as *const MemUnmapParams) };
                let exited = self.unmaps.exit(p.ptr, result() == CUDA_SUCCESS);
                if exited.own.is_some_and(|undo| undo.partial) {
                    // Said only once the driver has cut it: a refused unmap (the driver's
                    // answer to a part of a mapping) leaves the mapping whole and tracked.
                    log(
                        LogLevel::Warn,
                        format!(
                            "cuMemUnmap at {:#x} cut a mapping in part: launches run once while \
                             its rest is mapped",
                            p.ptr
                        ),
                    );
                }
                for undo in exited.back {
                    // Still mapped: tracked again as before (unless another thread's unmap of
                    // it succeeded meanwhile, see `InFlight`).
                    self.watch.unmap_failed(&self.inventory, undo);
                    log(
                        LogLevel::Debug,
                        format!(
                            "a refused cuMemUnmap's mappings that are still mapped are tracked \
                             again (at the EXIT of the one at {:#x})",
                            p.ptr
                        ),
                    );
                }
            }
            id if cbid::BEGIN_CAPTURE.contains(&id) => {
                // A capture cannot begin while a replay window drains or snapshots the device.
                let device = self.ordinal(data.context).map(|o| o as u64);
                if enter {
                    self.captures
                        .begin_enter(&self.locks, device, &self.known_devices());
                } else if exit {
                    let begun = (result() == CUDA_SUCCESS).then(|| {
                        // SAFETY: every cuStreamBeginCapture*_params starts with the stream.
                        let p = unsafe { *(params as *const StreamCaptureParams) };
                        let per_thread = matches!(
                            id,
                            cbid::CU_STREAM_BEGIN_CAPTURE_PTSZ
                                | cbid::CU_STREAM_BEGIN_CAPTURE_V2_PTSZ
                                | cbid::CU_STREAM_BEGIN_CAPTURE_TO_GRAPH_PTSZ
                        );
                        (CaptureStream::named(p.stream as usize, per_thread), device)
                    });
                    self.captures.begin_exit(begun);
                }
            }
            id if cbid::END_CAPTURE.contains(&id) && exit => {
                // SAFETY: both cuStreamEndCapture*_params start with the stream.
                let p = unsafe { *(params as *const StreamCaptureParams) };
                let per_thread = id == cbid::CU_STREAM_END_CAPTURE_PTSZ;
                if result() == CUDA_SUCCESS || !self.still_capturing(p.stream, per_thread) {
                    self.captures
                        .ended(CaptureStream::named(p.stream as usize, per_thread));
                }
            }
            cbid::CU_LAUNCH_KERNEL
            | cbid::CU_LAUNCH_KERNEL_PTSZ
            | cbid::CU_LAUNCH_KERNEL_EX
            | cbid::CU_LAUNCH_KERNEL_EX_PTSZ
            | cbid::CU_LAUNCH_COOPERATIVE_KERNEL
            | cbid::CU_LAUNCH_COOPERATIVE_KERNEL_PTSZ => {
                if enter {
                    // A launch whose device cannot be told still goes through `launch_enter`:
                    // counted, its tool asked (a replay is declined), and the reader sides of
                    // every known device held while it runs.
                    let ordinal = self.ordinal(data.context).unwrap_or(UNKNOWN_DEVICE);
                    // SAFETY: params is the call's parameter struct for this callback id.
                    let Some(launch) =
                        (unsafe { decode_launch(id, params, data.context, ordinal) })
                    else {
                        // cuLaunchKernelEx without a configuration: the driver refuses it, and
                        // nothing runs.
                        return;
                    };
                    let symbol = (!data.symbol_name.is_null())
                        // SAFETY: CUPTI's NUL-terminated kernel name, valid during the callback.
                        .then(|| unsafe { CStr::from_ptr(data.symbol_name) })
                        .map(CStr::to_string_lossy);
                    self.launch_enter(launch, symbol.as_deref());
                } else if exit {
                    let symbol = (!data.symbol_name.is_null())
                        // SAFETY: CUPTI's NUL-terminated kernel name, valid during the callback.
                        .then(|| unsafe { CStr::from_ptr(data.symbol_name) });
                    self.launch_exit(result(), symbol);
                }
            }
            _ => {}
        }
    }
}
