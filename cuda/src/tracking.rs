//! Memory the snapshot cannot cover, and virtual-memory mappings it can: the bookkeeping behind
//! "never silently replay a kernel that may write memory the snapshot does not hold".
//!
//! * **Managed memory** (`cuMemAllocManaged`) migrates between host and devices on demand; a
//!   kernel reaches it through any pointer, in its parameters or in memory. kreplay does not
//!   snapshot it: while any managed allocation is live, launches are declined
//!   (`untracked_memory`) and run once.
//! * **Virtual memory management** (`cuMemCreate` + `cuMemMap`, PyTorch's expandable segments):
//!   each mapped range is device memory of the device its physical memory was created on (the
//!   location of its allocation handle, `cuMemGetAllocationPropertiesFromHandle`, not the device
//!   of the context current at the call: a range may be mapped from another device's context),
//!   and is snapshotted like a `cuMemAlloc` allocation of that device while that device may read
//!   and write it: `cuMemMap` does not make a range accessible, `cuMemSetAccess` does (and may
//!   take the access away again, or give read access only), and a copy of memory its device may
//!   not access is not kreplay's to make (no kernel of that device can have written it either);
//!   `cuMemUnmap` removes the mappings it covers. A mapping whose handle is not on a device (host memory) or cannot be
//!   read, or an unmap that cuts a mapping in part, leaves memory kreplay cannot describe:
//!   launches are declined from then on while such memory is mapped.
//! * **Surfaces.** A kernel writes a CUDA array through a surface object
//!   (`cuSurfObjectCreate`), an opaque handle that looks like a small number in its arguments
//!   or in memory, or through a surface reference bound to an array (`cuSurfRefSetArray`).
//!   kreplay does not snapshot arrays: while a surface object is live in a context, and from the
//!   first surface reference bound there on, launches in that context are declined
//!   (`untracked_memory`) and run once; a context's end ends both. (Surface objects and
//!   references belong to the context they were made in. Texture objects only read arrays and
//!   need nothing.)
//!
//! * **Shared memory**: device memory opened from another process (`cuIpcOpenMemHandle`), a
//!   pointer imported from another process's pool (`cuMemPoolImportPointer`), a buffer mapped
//!   from external memory (`cuExternalMemoryGetMappedBuffer`) or a graphics resource's mapped
//!   pointer: a kernel writes it like its own memory, through its arguments or through
//!   pointers kept in memory, so it is snapshotted as device memory of the device that holds it
//!   (size and device from the driver) until it is closed, freed or unmapped; where the driver
//!   cannot describe it, launches are declined while it is mapped.
//!
//! [`MemoryWatch`] is pure bookkeeping (no driver), so its rules are tested without a GPU.

use std::collections::{BTreeMap, BTreeSet};

use kreplay_snapshot::{Inventory, MemoryKind, NewAllocation};
use parking_lot::Mutex;

/// `CU_MEM_LOCATION_TYPE_DEVICE` (cuda.h's `CUmemLocationType`).
pub const CU_MEM_LOCATION_TYPE_DEVICE: i32 = 1;
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE` (cuda.h's `CUmemAccess_flags`; `PROT_NONE` is 0,
/// `PROT_READ` 1).
pub const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: i32 = 3;

/// Where the physical memory behind a VMM allocation handle lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandleLocation {
    /// On the device of this ordinal.
    Device(i32),
    /// Somewhere else (host memory, a NUMA node: `CUmemLocationType` other than device).
    Other {
        /// The `CUmemLocationType`.
        location_type: i32,
    },
    /// The handle's properties could not be read (why).
    Unknown(String),
}

impl HandleLocation {
    /// From `CUmemAllocationProp::location` (`type`, `id`).
    pub fn from_location(location_type: i32, id: i32) -> HandleLocation {
        if location_type == CU_MEM_LOCATION_TYPE_DEVICE {
            HandleLocation::Device(id)
        } else {
            HandleLocation::Other { location_type }
        }
    }
}

/// What [`MemoryWatch::on_unmap`] decided.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unmapped {
    /// Tracked mappings (their bases) that the unmap removed: free them in the inventory.
    pub removed: Vec<u64>,
    /// Whether the unmap cut a mapping in part (that mapping is no longer tracked, and the
    /// remainder counts as untracked memory).
    pub partial: bool,
}

/// What the API ENTER of a `cuMemUnmap` changed ([`MemoryWatch::unmap_enter`]), to put back
/// when the unmap fails ([`MemoryWatch::unmap_failed`]).
#[derive(Debug, Default)]
pub struct UnmapUndo {
    /// The range whose untracked entries the unmap may have changed.
    span: (u64, u64),
    /// The tracked mappings it removed (base, size).
    mapped: Vec<(u64, u64)>,
    /// Their devices and access.
    access: Vec<(u64, (i32, bool))>,
    /// The untracked ranges it overlapped, as they were.
    untracked: Vec<(u64, u64)>,
    /// The inventory's allocations of the removed mappings (the caller adds them).
    pub allocations: Vec<kreplay_snapshot::Allocation>,
    /// Whether the unmap cuts a mapping in part ([`Unmapped::partial`]): worth a warning once
    /// the unmap succeeded, and nothing if the driver refused it (the mapping stays whole and
    /// tracked).
    pub partial: bool,
}

#[derive(Default)]
struct State {
    /// Live managed allocations: base → size.
    managed: BTreeMap<u64, u64>,
    /// Tracked VMM mappings: base → size.
    mapped: BTreeMap<u64, u64>,
    /// The device of each tracked VMM mapping, and whether that device may read and write it
    /// now (then, and only then, it is in the inventory): base → (device, writable).
    mapping_access: BTreeMap<u64, (i32, bool)>,
    /// Mapped ranges kreplay could not attribute: base → size.
    untracked: BTreeMap<u64, u64>,
    /// Live surface objects: handle → the context it was made in.
    surfaces: BTreeMap<u64, usize>,
    /// Contexts where a surface reference was bound to an array (never unbound until the
    /// context ends).
    surface_references: BTreeSet<usize>,
    /// Tracked device memory shared from another process or API: base → size.
    shared: BTreeMap<u64, u64>,
    /// Shared memory kreplay could not attribute (size or device unknown): base → size (0:
    /// unknown).
    unattributed: BTreeMap<u64, u64>,
    /// The references to each base of `shared` and `unattributed`: the calls that returned it
    /// and were not ended yet (`cuIpcOpenMemHandle` of a handle the context has open already
    /// returns the same pointer and counts one more reference, which `cuIpcCloseMemHandle`
    /// gives back; the memory stays mapped until the last one is).
    references: BTreeMap<u64, u32>,
    /// Mapped graphics resources: resource → the base of its mapped pointer.
    graphics: BTreeMap<usize, u64>,
    /// How many times a context of each handle ended (a handle may be a new context's after
    /// one ended): a surface destroy that failed puts its surface back only into the context
    /// it was made in.
    context_ends: BTreeMap<usize, u64>,
}

impl State {
    /// Gives back one reference to the shared memory at `base`: true when others are left (the
    /// memory stays), false when that was the last one or none was counted (it ends).
    fn drop_reference(&mut self, base: u64) -> bool {
        match self.references.get_mut(&base) {
            Some(n) if *n > 1 => {
                *n -= 1;
                true
            }
            _ => {
                self.references.remove(&base);
                false
            }
        }
    }
}

/// A surface object the API ENTER of its `cuSurfObjectDestroy` forgot
/// ([`MemoryWatch::surface_destroy_enter`]), kept until the call's API EXIT: a destroy the
/// driver refuses leaves the surface live ([`MemoryWatch::surface_destroy_failed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SurfaceDestroyed {
    handle: u64,
    /// The context it was made in.
    ctx: usize,
    /// How many times that context's handle had ended then.
    ends: u64,
}

/// The mapped pointers the API ENTER of a `cuGraphicsUnmapResources` ended
/// ([`MemoryWatch::graphics_unmap_enter`]), kept until the call's API EXIT: an unmap the driver
/// refuses leaves them mapped ([`MemoryWatch::graphics_unmap_failed`]).
#[derive(Debug, Default)]
pub struct GraphicsUnmapped {
    /// Each resource whose mapping ended, with what the end of its pointer forgot.
    ended: Vec<(usize, Forgotten)>,
}

impl GraphicsUnmapped {
    /// The mapped pointers that ended, each with whether only one of several references to it
    /// was given back (the memory stays tracked) and whether its memory left the inventory.
    pub fn ended(&self) -> impl Iterator<Item = (u64, bool, bool)> + '_ {
        self.ended
            .iter()
            .map(|(_, f)| (f.base, f.reference, f.allocation.is_some()))
    }
}

/// What the API ENTER of a free forgot ([`MemoryWatch::free_enter`]), kept until its API EXIT:
/// a free that fails leaves the memory live, and it is tracked again
/// ([`MemoryWatch::free_failed`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Forgotten {
    /// The freed address.
    pub base: u64,
    /// The tracked allocation that started there.
    pub allocation: Option<kreplay_snapshot::Allocation>,
    /// The managed allocation's size.
    pub managed: Option<u64>,
    /// The shared memory's size.
    pub shared: Option<u64>,
    /// The unattributed shared memory's size (0: unknown).
    pub unattributed: Option<u64>,
    /// The free gave back one of several references to shared memory there: the memory stays
    /// mapped and tracked (nothing else was forgotten).
    pub reference: bool,
}

/// What the API ENTER of each call in progress (a free, an unmap, a destroy) removed from
/// kreplay's bookkeeping, by the address or handle it names and the thread making it (a call's
/// ENTER and EXIT come on one thread), until the call's API EXIT says what to put back: what a
/// call the driver refused removed, unless another call naming the same object destroyed it
/// meanwhile.
///
/// Two threads naming one object at once (an application's double destroy or double free) are
/// told apart: the first ENTER removes the object, the second finds nothing left, and the
/// driver does one call and refuses the other, in either order. A call that removed nothing and
/// that the driver did destroyed what the other ENTER removed: nothing of it comes back. So the
/// record of a refused call is put back at once only when no call that removed nothing names
/// the object still; otherwise it waits for their outcome (put back if they were all refused,
/// dropped as soon as one succeeded), whichever EXIT comes first. A call names one address (a
/// free, a destroy) or a range (an unmap, [`enter_range`](Self::enter_range)); calls whose
/// ranges overlap name the same objects, and a successful one drops from the others' records
/// only what lay in its range ([`Removal::destroyed`]).
#[derive(Debug)]
pub struct InFlight<T> {
    state: Mutex<Calls<T>>,
}

#[derive(Debug)]
struct Calls<T> {
    calls: Vec<Call<T>>,
    /// What refused calls removed, with the range they named, waiting for the outcome of the
    /// calls in progress there that removed nothing.
    parked: Vec<(Span, T)>,
}

/// The addresses a call names: `[start, end)` (one address for a free or a destroy, the range
/// of a `cuMemUnmap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    start: u64,
    end: u64,
}

impl Span {
    fn overlaps(&self, other: &Span) -> bool {
        self.start < other.end && other.start < self.end
    }
}

/// One call in progress.
#[derive(Debug)]
struct Call<T> {
    thread: usize,
    span: Span,
    /// What its ENTER removed (`None` once calls naming the same addresses destroyed it all).
    kept: Option<T>,
    /// Whether that ENTER removed nothing.
    nothing: bool,
}

/// What a call's API ENTER removed, as [`InFlight`] keeps it.
pub trait Removal {
    /// Whether the ENTER found nothing to remove (the object was not tracked, or another
    /// call's ENTER removed it first).
    fn removed_nothing(&self) -> bool;

    /// Another call naming `[start, end)` destroyed what lay there: forgets that part. True when
    /// nothing is left to put back (the default: a call names one object, all of it).
    fn destroyed(&mut self, _start: u64, _end: u64) -> bool {
        true
    }
}

impl<T> Removal for Option<T> {
    fn removed_nothing(&self) -> bool {
        self.is_none()
    }
}

impl<A: Removal, B> Removal for (A, B) {
    fn removed_nothing(&self) -> bool {
        self.0.removed_nothing()
    }
}

impl Removal for Forgotten {
    fn removed_nothing(&self) -> bool {
        self.allocation.is_none()
            && self.managed.is_none()
            && self.shared.is_none()
            && self.unattributed.is_none()
            && !self.reference
    }
}

impl Removal for UnmapUndo {
    fn removed_nothing(&self) -> bool {
        self.mapped.is_empty() && self.untracked.is_empty() && self.allocations.is_empty()
    }

    /// The mappings inside `[start, end)` were unmapped by another call: none of them is put
    /// back. One the range cuts in part is not either, and its rest is put back as untracked
    /// memory (mapped still, but no longer one mapping kreplay can describe).
    fn destroyed(&mut self, start: u64, end: u64) -> bool {
        let cut = Span { start, end };
        let mut gone = Vec::new();
        self.mapped.retain(|&(b, sz)| {
            let m = Span {
                start: b,
                end: b.saturating_add(sz),
            };
            if !m.overlaps(&cut) {
                return true;
            }
            gone.push(m);
            false
        });
        for m in gone {
            self.access.retain(|(b, _)| *b != m.start);
            self.allocations.retain(|a| a.base != m.start);
            if m.start < start {
                self.untracked.push((m.start, start - m.start));
            }
            if m.end > end {
                self.untracked.push((end, m.end - end));
            }
        }
        // Untracked ranges it covers are unmapped too; the rest of one it cuts stays.
        let untracked = std::mem::take(&mut self.untracked);
        for (b, sz) in untracked {
            let u = Span {
                start: b,
                end: b.saturating_add(sz),
            };
            if !u.overlaps(&cut) {
                self.untracked.push((b, sz));
                continue;
            }
            if u.start < start {
                self.untracked.push((u.start, start - u.start));
            }
            if u.end > end {
                self.untracked.push((end, u.end - end));
            }
        }
        self.removed_nothing()
    }
}

impl Removal for GraphicsUnmapped {
    fn removed_nothing(&self) -> bool {
        self.ended.is_empty()
    }
}

/// What [`InFlight::exit`] hands back.
#[derive(Debug)]
pub struct Exited<T> {
    /// What this call's ENTER removed, when the driver did the call.
    pub own: Option<T>,
    /// What to put back now: refused calls' removals of objects no call destroyed.
    pub back: Vec<T>,
}

thread_local! {
    /// Its address names the thread. No destructor: readable to the thread's very end, from
    /// calls made by thread-local destructors too.
    static THREAD_KEY: u8 = const { 0 };
}

/// The calling thread, as a number no other live thread has.
fn thread_key() -> usize {
    THREAD_KEY.with(|k| std::ptr::from_ref(k) as usize)
}

impl<T> Default for InFlight<T> {
    fn default() -> Self {
        InFlight {
            state: Mutex::new(Calls {
                calls: Vec::new(),
                parked: Vec::new(),
            }),
        }
    }
}

impl<T: Removal> InFlight<T> {
    /// Nothing in progress.
    pub fn new() -> InFlight<T> {
        InFlight::default()
    }

    /// The API ENTER of a call naming `address` (a free, a destroy) removed `what`.
    pub fn enter(&self, address: u64, what: T) {
        self.enter_range(address, 1, what);
    }

    /// The API ENTER of a call naming the `len` bytes at `address` (a `cuMemUnmap`) removed
    /// `what`. Calls whose ranges overlap name the same objects.
    pub fn enter_range(&self, address: u64, len: u64, what: T) {
        let nothing = what.removed_nothing();
        let span = Span {
            start: address,
            end: address.saturating_add(len.max(1)),
        };
        self.state.lock().calls.push(Call {
            thread: thread_key(),
            span,
            kept: Some(what),
            nothing,
        });
    }

    /// The API EXIT of a call naming `address`, on the thread of its ENTER, which the driver
    /// did (`succeeded`) or refused.
    pub fn exit(&self, address: u64, succeeded: bool) -> Exited<T> {
        let thread = thread_key();
        let mut s = self.state.lock();
        let mut out = Exited {
            own: None,
            back: Vec::new(),
        };
        let Some(at) = s
            .calls
            .iter()
            .rposition(|c| c.thread == thread && c.span.start == address)
        else {
            return out;
        };
        let call = s.calls.swap_remove(at);
        let span = call.span;
        if succeeded {
            if call.nothing {
                // It destroyed what other calls' ENTERs removed there: that does not come back.
                for other in s.calls.iter_mut().filter(|c| c.span.overlaps(&span)) {
                    if let Some(kept) = &mut other.kept
                        && kept.destroyed(span.start, span.end)
                    {
                        other.kept = None;
                    }
                }
                s.parked.retain_mut(|(p, kept)| {
                    !p.overlaps(&span) || !kept.destroyed(span.start, span.end)
                });
            }
            out.own = call.kept;
        } else if let Some(kept) = call.kept {
            s.parked.push((span, kept));
        }
        // What no call that removed nothing may still destroy goes back now (what was left of
        // it, where this call destroyed part); the rest waits.
        let (back, parked): (Vec<_>, Vec<_>) =
            std::mem::take(&mut s.parked)
                .into_iter()
                .partition(|(p, _)| {
                    p.overlaps(&span) && !s.calls.iter().any(|c| c.nothing && c.span.overlaps(p))
                });
        s.parked = parked;
        out.back = back.into_iter().map(|(_, t)| t).collect();
        out
    }
}

/// Managed allocations and VMM mappings of the process.
#[derive(Default)]
pub struct MemoryWatch {
    state: Mutex<State>,
}

impl std::fmt::Debug for MemoryWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state.lock();
        f.debug_struct("MemoryWatch")
            .field("managed", &s.managed.len())
            .field("mapped", &s.mapped.len())
            .field("untracked", &s.untracked.len())
            .finish()
    }
}

impl MemoryWatch {
    /// A watch with nothing live.
    pub fn new() -> MemoryWatch {
        MemoryWatch::default()
    }

    /// `cuMemAllocManaged` succeeded.
    pub fn on_managed_alloc(&self, base: u64, size: u64) {
        self.state.lock().managed.insert(base, size);
    }

    /// `cuMemFree` of `base`: true when it was a managed allocation (now gone). Shared memory
    /// freed this way (an imported pool pointer, an external memory buffer) ends here too.
    pub fn on_free(&self, base: u64) -> bool {
        self.free_enter(None, base).managed.is_some()
    }

    /// The API ENTER of a `cuMemFree` / `cuMemFreeAsync` of `base`: the managed or shared
    /// memory there is forgotten and, unless it was managed, so is the tracked allocation of
    /// `inventory` (given) that starts there. What was forgotten is returned, for
    /// [`free_failed`](Self::free_failed).
    pub fn free_enter(&self, inventory: Option<&Inventory>, base: u64) -> Forgotten {
        let mut forgotten = {
            let mut s = self.state.lock();
            if s.drop_reference(base) {
                return Forgotten {
                    base,
                    reference: true,
                    ..Forgotten::default()
                };
            }
            Forgotten {
                base,
                shared: s.shared.remove(&base),
                unattributed: s.unattributed.remove(&base),
                managed: s.managed.remove(&base),
                allocation: None,
                reference: false,
            }
        };
        if forgotten.managed.is_none() {
            forgotten.allocation = inventory.and_then(|i| i.on_free(base));
        }
        forgotten
    }

    /// The free whose API ENTER forgot `forgotten` failed: the memory is still the
    /// application's, so it is tracked again as before (the same allocation, same generation:
    /// a snapshot taken before the free still restores it). Returns whether anything was put
    /// back.
    pub fn free_failed(&self, inventory: &Inventory, forgotten: Forgotten) -> bool {
        let Forgotten {
            base,
            allocation,
            managed,
            shared,
            unattributed,
            reference,
        } = forgotten;
        if reference {
            // The reference the free gave back, unless the memory ended meanwhile.
            let mut s = self.state.lock();
            return match s.references.get_mut(&base) {
                Some(n) => {
                    *n += 1;
                    true
                }
                None => false,
            };
        }
        // The inventory first: shared memory is tracked there too, and is put back only with
        // its allocation (it may have been replaced since).
        let tracked = allocation.is_some_and(|a| inventory.reinstate(a));
        let mut s = self.state.lock();
        let mut back = tracked;
        if let Some(size) = managed {
            s.managed.insert(base, size);
            back = true;
        }
        if let Some(size) = shared.filter(|_| tracked) {
            s.shared.insert(base, size);
            *s.references.entry(base).or_default() += 1;
        }
        if let Some(size) = unattributed {
            s.unattributed.insert(base, size);
            *s.references.entry(base).or_default() += 1;
            back = true;
        }
        back
    }

    /// Device memory another process or API shares with this one appeared at `base` (see
    /// `cupti::cbid::SHARED`), `size` bytes of device `device` where the driver says so. It is
    /// snapshotted like the application's own allocations: added to `inventory` as device
    /// memory of that device (its ordinal is returned). Where its size or device is not known,
    /// it is counted as untracked memory (the error says why), so launches decline until it
    /// ends ([`MemoryWatch::on_shared_end`]). Returned again (a handle opened again in the same
    /// context), it counts one more reference, and stays until each one ended.
    pub fn record_shared(
        &self,
        inventory: &Inventory,
        base: u64,
        size: Option<u64>,
        device: Option<i32>,
    ) -> Result<i32, String> {
        let mut s = self.state.lock();
        *s.references.entry(base).or_default() += 1;
        match (size.filter(|&n| n > 0), device.filter(|&d| d >= 0)) {
            (Some(size), Some(device)) => {
                let same = inventory.get(base).is_some_and(|a| {
                    a.size == size && a.owner_agent == device as u64 && s.shared.contains_key(&base)
                });
                if same {
                    // The same memory again: the same allocation, generation included.
                    return Ok(device);
                }
                s.shared.insert(base, size);
                inventory.on_alloc(NewAllocation {
                    base,
                    size,
                    owner_agent: device as u64,
                    kind: MemoryKind::CoarseDevice,
                });
                Ok(device)
            }
            (size, device) => {
                s.unattributed.insert(base, size.unwrap_or(0));
                Err(match (size, device) {
                    (None, _) => "the driver does not say its size".to_owned(),
                    _ => "the driver does not say which device holds it".to_owned(),
                })
            }
        }
    }

    /// A reference to shared memory at `base` ended (closed, unmapped): true when that was its
    /// last and it was tracked (the caller removes it from the inventory). While references are
    /// left, nothing changes.
    pub fn on_shared_end(&self, base: u64) -> bool {
        let mut s = self.state.lock();
        if s.drop_reference(base) {
            return false;
        }
        s.unattributed.remove(&base);
        s.shared.remove(&base).is_some()
    }

    /// The context holding the shared memory at `base` ends: every reference to it ends with
    /// it, so the next end ([`on_shared_end`](Self::on_shared_end),
    /// [`free_enter`](Self::free_enter)) is its last.
    pub fn end_references(&self, base: u64) {
        self.state.lock().references.remove(&base);
    }

    /// Graphics resource `resource` is mapped at `base`.
    pub fn on_graphics_mapped(&self, resource: usize, base: u64) {
        self.state.lock().graphics.insert(resource, base);
    }

    /// Graphics resource `resource` is unmapped: the base of its mapped pointer, if one was
    /// asked for (end it with [`MemoryWatch::on_shared_end`]).
    pub fn on_graphics_unmapped(&self, resource: usize) -> Option<u64> {
        self.state.lock().graphics.remove(&resource)
    }

    /// The API ENTER of a `cuGraphicsUnmapResources` of `resources`: the mapped pointer of each
    /// ends as a free of it would ([`free_enter`](Self::free_enter): one reference given back,
    /// and with the last the memory leaves `inventory`), since the driver unmaps it during the
    /// call and no snapshot may copy it from then on. What ended is returned, for
    /// [`graphics_unmap_failed`](Self::graphics_unmap_failed).
    pub fn graphics_unmap_enter(
        &self,
        inventory: &Inventory,
        resources: &[usize],
    ) -> GraphicsUnmapped {
        let mut ended = Vec::new();
        for &resource in resources {
            if let Some(base) = self.on_graphics_unmapped(resource) {
                ended.push((resource, self.free_enter(Some(inventory), base)));
            }
        }
        GraphicsUnmapped { ended }
    }

    /// The `cuGraphicsUnmapResources` whose API ENTER returned `unmapped` failed (a resource
    /// not mapped, its context not current): the driver unmapped nothing, so each mapping is
    /// tracked again as it was, its memory as the same allocation (a snapshot taken before
    /// still restores it), unless the resource was mapped anew since. Returns the bases whose
    /// memory is tracked again (not only a reference given back), for the caller's own
    /// bookkeeping.
    pub fn graphics_unmap_failed(
        &self,
        inventory: &Inventory,
        unmapped: GraphicsUnmapped,
    ) -> Vec<u64> {
        let mut back = Vec::new();
        for (resource, forgotten) in unmapped.ended {
            let base = forgotten.base;
            if self.state.lock().graphics.contains_key(&resource) {
                continue; // mapped anew: that mapping is the live one
            }
            let reference = forgotten.reference;
            if self.free_failed(inventory, forgotten) {
                self.state.lock().graphics.insert(resource, base);
                if !reference {
                    back.push(base);
                }
            }
        }
        back
    }

    /// `cuSurfObjectCreate` made surface object `handle` in context `ctx`.
    pub fn on_surface_created(&self, handle: u64, ctx: usize) {
        self.state.lock().surfaces.insert(handle, ctx);
    }

    /// `cuSurfObjectDestroy` of `handle`.
    pub fn on_surface_destroyed(&self, handle: u64) {
        self.surface_destroy_enter(handle);
    }

    /// The API ENTER of a `cuSurfObjectDestroy` of `handle`: the surface is forgotten (kernels
    /// can no longer write through it once the driver destroyed it); what it was is returned,
    /// for [`surface_destroy_failed`](Self::surface_destroy_failed).
    pub fn surface_destroy_enter(&self, handle: u64) -> Option<SurfaceDestroyed> {
        let mut s = self.state.lock();
        let ctx = s.surfaces.remove(&handle)?;
        let ends = s.context_ends.get(&ctx).copied().unwrap_or(0);
        Some(SurfaceDestroyed { handle, ctx, ends })
    }

    /// The `cuSurfObjectDestroy` whose API ENTER returned `destroyed` failed (a handle the
    /// driver does not know, its context not current): the surface is still live, and launches
    /// in its context decline again, unless its context ended meanwhile or a surface of that
    /// handle was made since. Returns whether it was put back.
    pub fn surface_destroy_failed(&self, destroyed: SurfaceDestroyed) -> bool {
        let SurfaceDestroyed { handle, ctx, ends } = destroyed;
        let mut s = self.state.lock();
        if s.surfaces.contains_key(&handle)
            || s.context_ends.get(&ctx).copied().unwrap_or(0) != ends
        {
            return false;
        }
        s.surfaces.insert(handle, ctx);
        true
    }

    /// `cuSurfRefSetArray` bound a surface reference of a module of context `ctx` to an array:
    /// that context's kernels may write the array from now on (nothing unbinds a surface
    /// reference but the context's end).
    pub fn on_surface_reference_bound(&self, ctx: usize) {
        self.state.lock().surface_references.insert(ctx);
    }

    /// Context `ctx` is about to be destroyed: its surface objects and references end with it.
    pub fn on_context_destroyed(&self, ctx: usize) {
        let mut s = self.state.lock();
        s.surfaces.retain(|_, c| *c != ctx);
        s.surface_references.remove(&ctx);
        *s.context_ends.entry(ctx).or_default() += 1;
    }

    /// `cuMemMap` of `size` bytes at `base` succeeded, on `device` when known. Returns true when
    /// the mapping is tracked (the caller adds it to the inventory as device memory of
    /// `device`); false when it is counted as untracked memory.
    pub fn on_map(&self, base: u64, size: u64, device: Option<i32>) -> bool {
        let mut s = self.state.lock();
        if device.is_some() && size > 0 {
            s.mapped.insert(base, size);
            true
        } else {
            s.untracked.insert(base, size);
            false
        }
    }

    /// `cuMemMap` of `size` bytes at `base` succeeded, with the physical memory of a handle at
    /// `location`: a mapping on a device is tracked (its ordinal is returned), and added to
    /// `inventory` as device memory of that device once `cuMemSetAccess` lets that device read
    /// and write it ([`MemoryWatch::record_access`]); anything else is counted as untracked
    /// memory (the error says why), so launches decline while it is mapped.
    pub fn record_map(
        &self,
        inventory: &Inventory,
        base: u64,
        size: u64,
        location: HandleLocation,
    ) -> Result<i32, String> {
        let (device, why) = match location {
            HandleLocation::Device(d) if d >= 0 => (Some(d), String::new()),
            HandleLocation::Device(d) => (None, format!("invalid device ordinal {d}")),
            HandleLocation::Other { location_type } => (
                None,
                format!("the handle's memory is not device memory (location type {location_type})"),
            ),
            HandleLocation::Unknown(e) => (None, e),
        };
        if self.on_map(base, size, device)
            && let Some(d) = device
        {
            // Not accessible yet: out of the inventory until its device may write it. A stale
            // entry there (memory freed unseen) ends now that the range is mapped anew.
            self.state.lock().mapping_access.insert(base, (d, false));
            inventory.forget_overlapping(base, size);
            return Ok(d);
        }
        Err(if why.is_empty() {
            "an empty mapping".to_owned()
        } else {
            why
        })
    }

    /// For kernel argument `values`: the bases of the mappings a kernel given them may write
    /// besides the one each value lies in. A range mapped page by page (PyTorch's expandable
    /// segments: one `cuMemCreate` handle and one `cuMemMap` per page of a reserved range)
    /// holds buffers larger than a page, or across a page's end, so a pointer into one mapping
    /// reaches the mappings that continue it, before and after: for a value inside a tracked
    /// mapping, every writable mapping (in the inventory) of the run of address-contiguous
    /// tracked mappings holding it (or ending at it: an end pointer). Empty when no value lies
    /// in a mapping.
    pub fn mapped_runs(&self, values: &[u64]) -> Vec<u64> {
        let s = self.state.lock();
        if s.mapped.is_empty() {
            return Vec::new();
        }
        let holding = |addr: u64| {
            let (&base, &size) = s.mapped.range(..=addr).next_back()?;
            (addr < base.saturating_add(size)).then_some(base)
        };
        let mut out: Vec<u64> = Vec::new();
        let mut done: BTreeSet<u64> = BTreeSet::new();
        for &v in values {
            // One past a mapping's end is an end pointer: a kernel may walk back from it.
            let Some(first) = holding(v).or_else(|| holding(v.checked_sub(1)?)) else {
                continue;
            };
            if done.contains(&first) {
                continue; // its run is listed already
            }
            // Back to the run's first mapping, then forward to its last.
            let mut start = first;
            while let Some(before) = start.checked_sub(1).and_then(holding) {
                start = before;
            }
            let mut at = Some(start);
            while let Some(base) = at {
                done.insert(base);
                if s.mapping_access.get(&base).is_some_and(|&(_, w)| w) {
                    out.push(base);
                }
                let end = base.saturating_add(s.mapped[&base]);
                // (A mapping ending at the top of the address space continues nothing.)
                at = s
                    .mapped
                    .get(&end)
                    .filter(|_| end > base && !done.contains(&end))
                    .map(|_| end);
            }
        }
        out
    }

    /// The device of the tracked VMM mapping holding `addr`, if any (accessible or not).
    pub fn mapping_device(&self, addr: u64) -> Option<i32> {
        let s = self.state.lock();
        let (&base, &size) = s.mapped.range(..=addr).next_back()?;
        if addr >= base.saturating_add(size) {
            return None;
        }
        s.mapping_access.get(&base).map(|&(d, _)| d)
    }

    /// `cuMemSetAccess` over `size` bytes at `base` succeeded with `access` (device ordinal and
    /// `CUmemAccess_flags`, in the call's order; a later entry for a device overrides an
    /// earlier one): each tracked mapping in the range whose own device the call names enters
    /// `inventory` when that device may now read and write it, and leaves it when it may not
    /// (read-only or no access: no kernel of that device writes it, and a restore there would
    /// fault). Returns the bases that entered and the bases that left.
    pub fn record_access(
        &self,
        inventory: &Inventory,
        base: u64,
        size: u64,
        access: &[(u64, i32)],
    ) -> (Vec<u64>, Vec<u64>) {
        let end = base.saturating_add(size);
        let mut s = self.state.lock();
        let in_range: Vec<(u64, u64)> = s
            .mapped
            .iter()
            .filter(|&(&b, &sz)| b < end && b.saturating_add(sz) > base)
            .map(|(&b, &sz)| (b, sz))
            .collect();
        let (mut entered, mut left) = (Vec::new(), Vec::new());
        for (b, sz) in in_range {
            let Some((device, writable)) = s.mapping_access.get(&b).copied() else {
                continue;
            };
            let Some(flags) = access
                .iter()
                .rev()
                .find(|(d, _)| *d == device as u64)
                .map(|&(_, f)| f)
            else {
                continue; // its own device's access is unchanged
            };
            let now = flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            if now && !writable {
                inventory.on_alloc(NewAllocation {
                    base: b,
                    size: sz,
                    owner_agent: device as u64,
                    kind: MemoryKind::CoarseDevice,
                });
                entered.push(b);
            } else if !now && writable {
                inventory.on_free(b);
                left.push(b);
            }
            s.mapping_access.insert(b, (device, now));
        }
        (entered, left)
    }

    /// The API ENTER of a `cuMemUnmap` of `size` bytes at `base`: [`on_unmap`](Self::on_unmap),
    /// and what it changed, for [`unmap_failed`](Self::unmap_failed). The caller frees the
    /// removed mappings in the inventory and adds what that forgot to the undo.
    pub fn unmap_enter(&self, base: u64, size: u64) -> (Unmapped, UnmapUndo) {
        let end = base.saturating_add(size);
        let undo = {
            let s = self.state.lock();
            let overlapping = |m: &BTreeMap<u64, u64>| -> Vec<(u64, u64)> {
                m.iter()
                    .filter(|&(&b, &sz)| b < end && b.saturating_add(sz) > base)
                    .map(|(&b, &sz)| (b, sz))
                    .collect()
            };
            let mapped = overlapping(&s.mapped);
            let untracked = overlapping(&s.untracked);
            let access = mapped
                .iter()
                .filter_map(|&(b, _)| s.mapping_access.get(&b).map(|&a| (b, a)))
                .collect();
            let span = mapped
                .iter()
                .chain(&untracked)
                .fold((base, end), |(lo, hi), &(b, sz)| {
                    (lo.min(b), hi.max(b.saturating_add(sz)))
                });
            UnmapUndo {
                span,
                mapped,
                access,
                untracked,
                allocations: Vec::new(),
                partial: false,
            }
        };
        let out = self.on_unmap(base, size);
        (
            out.clone(),
            UnmapUndo {
                partial: out.partial,
                ..undo
            },
        )
    }

    /// The `cuMemUnmap` whose API ENTER made `undo` failed: its mappings are still mapped, and
    /// tracked again as before (their allocations with their generations, unless memory
    /// mapped since overlaps them).
    pub fn unmap_failed(&self, inventory: &Inventory, undo: UnmapUndo) {
        let UnmapUndo {
            span: (lo, hi),
            mapped,
            access,
            untracked,
            allocations,
            partial: _,
        } = undo;
        for allocation in allocations {
            inventory.reinstate(allocation);
        }
        let mut s = self.state.lock();
        let cut: Vec<u64> = s
            .untracked
            .iter()
            .filter(|&(&b, &sz)| b < hi && b.saturating_add(sz) > lo)
            .map(|(&b, _)| b)
            .collect();
        for b in cut {
            s.untracked.remove(&b);
        }
        s.untracked.extend(untracked);
        s.mapped.extend(mapped);
        s.mapping_access.extend(access);
    }

    /// `cuMemUnmap` of `size` bytes at `base`: every mapping inside the range is removed; a
    /// mapping the range cuts in part is dropped from tracking and its rest stays untracked.
    pub fn on_unmap(&self, base: u64, size: u64) -> Unmapped {
        let end = base.saturating_add(size);
        let mut s = self.state.lock();
        let mut out = Unmapped::default();
        let overlapping = |m: &BTreeMap<u64, u64>| -> Vec<(u64, u64)> {
            m.iter()
                .filter(|&(&b, &sz)| b < end && b.saturating_add(sz) > base)
                .map(|(&b, &sz)| (b, sz))
                .collect()
        };
        for (b, sz) in overlapping(&s.mapped) {
            s.mapped.remove(&b);
            s.mapping_access.remove(&b);
            out.removed.push(b);
            let e = b.saturating_add(sz);
            if b < base {
                s.untracked.insert(b, base - b);
                out.partial = true;
            }
            if e > end {
                s.untracked.insert(end, e - end);
                out.partial = true;
            }
        }
        for (b, sz) in overlapping(&s.untracked) {
            s.untracked.remove(&b);
            let e = b.saturating_add(sz);
            if b < base {
                s.untracked.insert(b, base - b);
            }
            if e > end {
                s.untracked.insert(end, e - end);
            }
        }
        out
    }

    /// Why no launch in context `ctx` may be replayed now (`None`: nothing live that the
    /// snapshot misses).
    pub fn untracked_reason(&self, ctx: usize) -> Option<String> {
        let s = self.state.lock();
        if let Some((&base, &size)) = s.managed.iter().next() {
            return Some(format!(
                "{} managed allocation(s) live (first: {size} bytes at {base:#x}); managed memory \
                 is not snapshotted",
                s.managed.len()
            ));
        }
        let mut live = s.surfaces.iter().filter(|(_, c)| **c == ctx);
        if let Some((&first, _)) = live.next() {
            return Some(format!(
                "{} surface object(s) live in the launch's context (first: {first}); kernels \
                 write CUDA arrays through them, and arrays are not snapshotted",
                1 + live.count()
            ));
        }
        if s.surface_references.contains(&ctx) {
            return Some(
                "a surface reference was bound to a CUDA array (cuSurfRefSetArray); kernels \
                 write arrays through it, and arrays are not snapshotted"
                    .to_owned(),
            );
        }
        if let Some((&base, &size)) = s.untracked.iter().next() {
            return Some(format!(
                "{} mapped range(s) kreplay cannot attribute to a device (first: {size} bytes at \
                 {base:#x})",
                s.untracked.len()
            ));
        }
        if let Some(&base) = s.unattributed.keys().next() {
            return Some(format!(
                "{} range(s) of memory shared from another process or API that kreplay cannot \
                 describe (first at {base:#x})",
                s.unattributed.len()
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kreplay_snapshot::Filter;

    fn bases_on(inventory: &Inventory, device: u64) -> Vec<u64> {
        inventory
            .select(&Filter::for_replay(device))
            .iter()
            .map(|r| r.base)
            .collect()
    }

    #[test]
    fn a_mapping_belongs_to_the_device_of_its_handle_not_to_the_current_context() {
        // Two devices: the thread's current context is device 0's, the physical memory behind
        // the handle was created on device 1 (a peer mapping).
        let w = MemoryWatch::new();
        let inventory = Inventory::new();
        let mapped = w.record_map(&inventory, 0x10_0000, 0x20_0000, HandleLocation::Device(1));
        assert_eq!(mapped, Ok(1));
        // Device 0 is given access too (a peer mapping): it is still device 1's memory.
        let access = [(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), (1, 3)];
        w.record_access(&inventory, 0x10_0000, 0x20_0000, &access);
        assert_eq!(
            bases_on(&inventory, 1),
            vec![0x10_0000],
            "snapshotted for device 1"
        );
        assert!(bases_on(&inventory, 0).is_empty(), "not device 0's memory");
        assert_eq!(w.untracked_reason(CTX), None);
        // Its unmap removes it from the inventory of the device it was attributed to.
        assert_eq!(w.on_unmap(0x10_0000, 0x20_0000).removed, vec![0x10_0000]);
    }

    #[test]
    fn a_mapping_enters_the_snapshot_only_once_its_device_may_write_it() {
        // cuMemMap does not make a range accessible (cuMemSetAccess does): a snapshot taken
        // between the two would copy memory its device may not touch yet, and no kernel can
        // have written it.
        let w = MemoryWatch::new();
        let inventory = Inventory::new();
        let mapped = w.record_map(&inventory, 0x10_0000, 0x20_0000, HandleLocation::Device(0));
        assert_eq!(mapped, Ok(0));
        assert!(
            bases_on(&inventory, 0).is_empty(),
            "snapshotted before any device may access it"
        );
        assert_eq!(w.untracked_reason(CTX), None, "nothing to decline for");
        assert_eq!(w.mapping_device(0x10_0000 + 0x1f_ffff), Some(0));
        assert_eq!(w.mapping_device(0x30_0000), None);
        // Access for another device only, then read-only access for its own: still out.
        let peer = w.record_access(&inventory, 0x10_0000, 0x20_0000, &[(1, 3)]);
        assert_eq!(peer, (vec![], vec![]));
        w.record_access(&inventory, 0x10_0000, 0x20_0000, &[(0, 1)]);
        assert!(
            bases_on(&inventory, 0).is_empty(),
            "read-only: no kernel writes it"
        );
        // Read and write access for its device (over a wider range, as PyTorch sets it over a
        // whole segment): snapshotted from now on.
        let rw = w.record_access(&inventory, 0, 0x100_0000, &[(1, 1), (0, 3)]);
        assert_eq!(rw, (vec![0x10_0000], vec![]));
        assert_eq!(bases_on(&inventory, 0), vec![0x10_0000]);
        // Access taken away again: out, still mapped, nothing declined.
        let none = w.record_access(&inventory, 0x10_0000, 0x20_0000, &[(0, 0)]);
        assert_eq!(none, (vec![], vec![0x10_0000]));
        assert!(bases_on(&inventory, 0).is_empty());
        assert_eq!(w.untracked_reason(CTX), None);
        // Unmapped and mapped again: inaccessible again until access is set.
        w.record_access(&inventory, 0x10_0000, 0x20_0000, &[(0, 3)]);
        assert_eq!(w.on_unmap(0x10_0000, 0x20_0000).removed, vec![0x10_0000]);
        inventory.on_free(0x10_0000);
        w.record_map(&inventory, 0x10_0000, 0x20_0000, HandleLocation::Device(0))
            .unwrap();
        assert!(bases_on(&inventory, 0).is_empty());
    }

    /// PyTorch's expandable segments map one reserved range page by page (a `cuMemCreate` handle
    /// and a `cuMemMap` per page, one `cuMemSetAccess` over the whole): a tensor larger than a
    /// page spans several mappings, and a kernel given its start writes the pages after it.
    /// Under `KREPLAY_SNAPSHOT_SCOPE=referenced` the argument reached only the page holding it,
    /// so the passes wrote the following pages again and again, unrestored.
    #[test]
    fn an_argument_into_a_run_of_contiguous_mappings_reaches_every_writable_one_of_them() {
        let w = MemoryWatch::new();
        let inventory = Inventory::new();
        let page = 0x20_0000u64;
        let rw = [(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE)];
        // Four pages back to back from 0x100_0000, the third not accessible yet; a separate
        // mapping after a gap.
        for k in 0..4 {
            let base = 0x100_0000 + k * page;
            w.record_map(&inventory, base, page, HandleLocation::Device(0))
                .unwrap();
            if k != 2 {
                w.record_access(&inventory, base, page, &rw);
            }
        }
        let apart = 0x200_0000;
        w.record_map(&inventory, apart, page, HandleLocation::Device(0))
            .unwrap();
        w.record_access(&inventory, apart, page, &rw);

        // A tensor starting in the second page.
        let values = vec![0x100_0000 + page + 0x100];
        let mut reached = values.clone();
        reached.extend(w.mapped_runs(&values));
        let scoped = crate::scope::launch_filter(
            Filter::referenced_only(0),
            &inventory,
            &[],
            &reached,
            |_, _| None,
        )
        .expect("nothing to decline");
        let mut bases: Vec<u64> = scoped
            .filter
            .reached()
            .filter_map(|a| inventory.lookup(a).map(|x| x.base))
            .collect();
        bases.sort_unstable();
        bases.dedup();
        assert_eq!(scoped.referenced_bytes, 3 * page);
        assert_eq!(
            bases,
            vec![0x100_0000, 0x100_0000 + page, 0x100_0000 + 3 * page],
            "every writable page of the run, not the inaccessible one nor the one apart"
        );
        // An end pointer of the run reaches it too (a kernel walking back from it).
        let mut end = w.mapped_runs(&[0x100_0000 + 4 * page]);
        end.sort_unstable();
        assert_eq!(end, bases, "{end:x?}");
        // A value in no mapping adds nothing.
        assert!(w.mapped_runs(&[0x5000_0000, 7]).is_empty());
    }

    /// A mapping reported at the very top of the address space (its end saturates to its own
    /// base): the walk along a run of mappings ends instead of following it to itself forever.
    #[test]
    fn a_mapping_at_the_top_of_the_address_space_ends_its_run() {
        let w = std::sync::Arc::new(MemoryWatch::new());
        let inventory = Inventory::new();
        let rw = [(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE)];
        for (base, size) in [(u64::MAX - 0x1000, 0x1000), (u64::MAX, 1)] {
            w.record_map(&inventory, base, size, HandleLocation::Device(0))
                .unwrap();
            w.record_access(&inventory, base, size, &rw);
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let walker = w.clone();
        std::thread::spawn(move || {
            let _ = tx.send(walker.mapped_runs(&[u64::MAX]));
        });
        let run = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the walk ends");
        assert_eq!(
            run,
            vec![u64::MAX - 0x1000],
            "the writable mapping of the run"
        );
    }

    #[test]
    fn a_mapping_of_host_memory_or_of_a_handle_that_cannot_be_read_is_untracked() {
        let w = MemoryWatch::new();
        let inventory = Inventory::new();
        let host = w.record_map(
            &inventory,
            0x10_0000,
            0x1000,
            HandleLocation::Other { location_type: 2 },
        );
        assert!(host.unwrap_err().contains("not device memory"));
        let unknown = w.record_map(
            &inventory,
            0x20_0000,
            0x1000,
            HandleLocation::Unknown("cuMemGetAllocationPropertiesFromHandle failed".into()),
        );
        assert!(
            unknown
                .unwrap_err()
                .contains("cuMemGetAllocationPropertiesFromHandle")
        );
        assert!(bases_on(&inventory, 0).is_empty() && bases_on(&inventory, 2).is_empty());
        assert!(
            w.untracked_reason(CTX)
                .unwrap()
                .contains("cannot attribute")
        );
        w.on_unmap(0x10_0000, 0x20_0000);
        assert_eq!(w.untracked_reason(CTX), None);
    }

    /// A context, for the rules that do not depend on it.
    const CTX: usize = 0x5000;

    /// An application thread for a test of calls racing on several threads: each closure it is
    /// given runs on it, in turn, and [`Worker::run`] returns once it returned (at most 10 s).
    /// [`InFlight`] tells calls apart by thread, so a call's ENTER and EXIT run on one worker.
    struct Worker {
        work: Option<std::sync::mpsc::Sender<Box<dyn FnOnce() + Send>>>,
        done: std::sync::mpsc::Receiver<()>,
        thread: Option<std::thread::JoinHandle<()>>,
    }

    impl Worker {
        fn new() -> Worker {
            let (work, todo) = std::sync::mpsc::channel::<Box<dyn FnOnce() + Send>>();
            let (finished, done) = std::sync::mpsc::channel();
            let thread = std::thread::spawn(move || {
                for f in todo {
                    f();
                    let _ = finished.send(());
                }
            });
            Worker {
                work: Some(work),
                done,
                thread: Some(thread),
            }
        }

        fn run(&self, f: impl FnOnce() + Send + 'static) {
            self.work.as_ref().unwrap().send(Box::new(f)).unwrap();
            self.done
                .recv_timeout(std::time::Duration::from_secs(10))
                .expect("the worker's step returned");
        }
    }

    impl Drop for Worker {
        fn drop(&mut self) {
            drop(self.work.take());
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }

    /// The state one racing-destroy scenario runs on.
    struct Race {
        watch: MemoryWatch,
        graphs: crate::graphmem::GraphMemory,
        inventory: Inventory,
        surfaces: InFlight<Option<SurfaceDestroyed>>,
        execs: InFlight<Option<crate::graphmem::ExecDestroyed>>,
        frees: InFlight<Forgotten>,
        unmaps: InFlight<UnmapUndo>,
        graphics: InFlight<GraphicsUnmapped>,
    }

    const EXEC: usize = 0xe0;
    const SURFACE: u64 = 5;
    const FREED: u64 = 0x10_0000;
    const MAPPED: u64 = 0x40_0000;
    const RESOURCE: usize = 0x9e;
    const GRAPHICS: u64 = 0x90_0000;

    impl Race {
        fn new() -> Race {
            let r = Race {
                watch: MemoryWatch::new(),
                graphs: crate::graphmem::GraphMemory::new(),
                inventory: Inventory::new(),
                surfaces: InFlight::new(),
                execs: InFlight::new(),
                frees: InFlight::new(),
                unmaps: InFlight::new(),
                graphics: InFlight::new(),
            };
            r.watch.on_surface_created(SURFACE, CTX);
            let nodes = crate::graphmem::GraphNodes {
                allocs: vec![crate::graphmem::GraphAlloc {
                    base: 0x80_0000,
                    size: 0x1000,
                    place: crate::graphmem::Place::Device(0),
                }],
                frees: Vec::new(),
            };
            r.graphs.on_instantiated(EXEC, Ok(nodes), 0);
            r.inventory.on_alloc(NewAllocation {
                base: FREED,
                size: 0x1000,
                owner_agent: 0,
                kind: MemoryKind::CoarseDevice,
            });
            r.watch
                .record_map(&r.inventory, MAPPED, 0x20_0000, HandleLocation::Device(0))
                .unwrap();
            let access = [(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE)];
            r.watch
                .record_access(&r.inventory, MAPPED, 0x20_0000, &access);
            r.watch
                .record_shared(&r.inventory, GRAPHICS, Some(0x1000), Some(0))
                .unwrap();
            r.watch.on_graphics_mapped(RESOURCE, GRAPHICS);
            r
        }

        /// The API ENTER of a destroy of the surface, the executable graph, the allocation
        /// and the mapping, as `inject` handles each.
        fn enter(&self) {
            self.surfaces
                .enter(SURFACE, self.watch.surface_destroy_enter(SURFACE));
            self.execs
                .enter(EXEC as u64, self.graphs.exec_destroy_enter(EXEC));
            self.frees
                .enter(FREED, self.watch.free_enter(Some(&self.inventory), FREED));
            let (out, mut undo) = self.watch.unmap_enter(MAPPED, 0x20_0000);
            for base in out.removed {
                undo.allocations.extend(self.inventory.on_free(base));
            }
            self.unmaps.enter_range(MAPPED, 0x20_0000, undo);
            let unmapped = self
                .watch
                .graphics_unmap_enter(&self.inventory, &[RESOURCE]);
            self.graphics.enter(RESOURCE as u64, unmapped);
        }

        /// Their API EXITs, each `refused` by the driver or not.
        fn exit(&self, refused: bool) {
            let ok = !refused;
            for back in self.surfaces.exit(SURFACE, ok).back.into_iter().flatten() {
                self.watch.surface_destroy_failed(back);
            }
            for back in self.execs.exit(EXEC as u64, ok).back.into_iter().flatten() {
                self.graphs.exec_destroy_failed(back);
            }
            for back in self.frees.exit(FREED, ok).back {
                self.watch.free_failed(&self.inventory, back);
            }
            for back in self.unmaps.exit(MAPPED, ok).back {
                self.watch.unmap_failed(&self.inventory, back);
            }
            for back in self.graphics.exit(RESOURCE as u64, ok).back {
                self.watch.graphics_unmap_failed(&self.inventory, back);
            }
        }

        /// What is live: the surface, the executable graph, the allocation, the mapping, the
        /// graphics resource's mapped memory.
        fn live(&self) -> [bool; 5] {
            [
                self.watch.untracked_reason(CTX).is_some(),
                self.graphs.allocates(EXEC),
                self.inventory.get(FREED).is_some(),
                self.inventory.get(MAPPED).is_some(),
                self.inventory.get(GRAPHICS).is_some(),
            ]
        }
    }

    /// Two threads destroy the same surface object, executable graph, allocation, mapping and
    /// graphics resource mapping at once (an application's double destroy, double free, double
    /// unmap; `inject` keeps a `cuGraphicsUnmapResources` per resource): B's API ENTER
    /// forgets each, A's finds nothing left, and the driver does A's and refuses B's (the
    /// handle is gone). B's refused EXIT tracked them all again though none was live: launches
    /// in the surface's context declined for the rest of its life, later graph launches taken
    /// for allocating ones, freed and unmapped memory snapshotted and restored (an illegal
    /// address). Whatever order the EXITs come in, what A destroyed stays forgotten; when the
    /// driver refuses both, it is all live again.
    #[test]
    fn a_refused_destroy_racing_a_successful_one_leaves_the_object_destroyed() {
        for (a_refused, a_exits_first) in
            [(false, false), (false, true), (true, false), (true, true)]
        {
            let race = std::sync::Arc::new(Race::new());
            assert_eq!(race.live(), [true; 5]);
            let (a, b) = (Worker::new(), Worker::new());
            let r = race.clone();
            b.run(move || r.enter());
            let r = race.clone();
            a.run(move || r.enter());
            let (ra, rb) = (race.clone(), race.clone());
            let exit_a = move || ra.exit(a_refused);
            let exit_b = move || rb.exit(true);
            if a_exits_first {
                a.run(exit_a);
                b.run(exit_b);
            } else {
                b.run(exit_b);
                a.run(exit_a);
            }
            assert_eq!(
                race.live(),
                [a_refused; 5],
                "A refused: {a_refused}, A's EXIT first: {a_exits_first}"
            );
        }
    }

    #[test]
    fn a_live_surface_object_blocks_replay_until_destroyed_and_a_bound_reference_for_good() {
        let w = MemoryWatch::new();
        w.on_surface_created(1, CTX);
        w.on_surface_created(2, CTX);
        let why = w
            .untracked_reason(CTX)
            .expect("declined while surfaces are live");
        assert!(
            why.contains("2 surface object(s)") && why.contains("arrays"),
            "{why}"
        );
        w.on_surface_destroyed(1);
        assert!(w.untracked_reason(CTX).is_some());
        w.on_surface_destroyed(2);
        w.on_surface_destroyed(7); // unknown: nothing happens
        assert_eq!(w.untracked_reason(CTX), None);
        w.on_surface_reference_bound(CTX);
        let why = w
            .untracked_reason(CTX)
            .expect("a bound reference is never unbound");
        assert!(why.contains("cuSurfRefSetArray"), "{why}");
    }

    /// Surface objects and references belong to their context: launches of another context are
    /// replayed, and the context's end ends them (a surface left live in a destroyed context
    /// declined every later launch of the process).
    #[test]
    fn surfaces_decline_only_their_own_contexts_launches_and_end_with_it() {
        let (a, b) = (CTX, CTX + 0x1000);
        let w = MemoryWatch::new();
        w.on_surface_created(5, a);
        w.on_surface_reference_bound(a);
        assert!(w.untracked_reason(a).is_some());
        assert_eq!(w.untracked_reason(b), None, "another context's launches");
        w.on_context_destroyed(b);
        assert!(w.untracked_reason(a).is_some(), "another context's end");
        w.on_context_destroyed(a);
        assert_eq!(w.untracked_reason(a), None, "ended with its context");
        w.on_managed_alloc(0x1000, 64);
        assert!(
            w.untracked_reason(b).is_some(),
            "managed memory is reached from every context"
        );
    }

    #[test]
    fn shared_memory_is_snapshotted_on_its_device_until_it_ends() {
        let w = MemoryWatch::new();
        let inv = Inventory::new();
        // Opened from another process: 2 MiB on device 1.
        assert_eq!(
            w.record_shared(&inv, 0x7000_0000, Some(2 << 20), Some(1)),
            Ok(1)
        );
        let a = inv.lookup(0x7000_0000 + 100).expect("in the inventory");
        assert_eq!((a.base, a.size, a.owner_agent), (0x7000_0000, 2 << 20, 1));
        assert_eq!(w.untracked_reason(CTX), None, "tracked, so replay goes on");
        assert!(w.on_shared_end(0x7000_0000));
        assert!(!w.on_shared_end(0x7000_0000), "ended once");
        // An imported pool pointer ends with cuMemFree (the caller frees the inventory's).
        w.record_shared(&inv, 0x9000_0000, Some(4096), Some(0))
            .unwrap();
        assert!(!w.on_free(0x9000_0000), "not managed memory");
        assert!(!w.on_shared_end(0x9000_0000), "already ended by the free");
    }

    /// `cuIpcOpenMemHandle` of a handle the context has open already returns the same pointer
    /// and counts one more reference; the memory stays mapped until `cuIpcCloseMemHandle` was
    /// called as often. The first close ended it here: a kernel writing it through a pointer
    /// kept in memory had its writes repeated by every pass, and memory that could not be
    /// described stopped declining launches while still mapped.
    #[test]
    fn shared_memory_opened_twice_stays_tracked_until_closed_as_often() {
        let w = MemoryWatch::new();
        let inv = Inventory::new();
        let base = 0x7000_0000;
        assert_eq!(w.record_shared(&inv, base, Some(2 << 20), Some(0)), Ok(0));
        let generation = inv.get(base).unwrap().generation;
        assert_eq!(w.record_shared(&inv, base, Some(2 << 20), Some(0)), Ok(0));
        assert!(!w.on_shared_end(base), "one reference is left");
        assert_eq!(
            inv.get(base).map(|a| a.generation),
            Some(generation),
            "the same allocation, still tracked"
        );
        assert!(w.on_shared_end(base), "the last reference ends it");
        assert!(!w.on_shared_end(base), "ended once");

        // Opened twice, freed once (an imported pointer): still tracked, and a refused free
        // of it puts the reference back.
        w.record_shared(&inv, base, Some(4096), Some(0)).unwrap();
        w.record_shared(&inv, base, Some(4096), Some(0)).unwrap();
        let forgotten = w.free_enter(Some(&inv), base);
        assert!(inv.get(base).is_some(), "one reference is left");
        assert!(w.free_failed(&inv, forgotten));
        assert!(!w.on_shared_end(base));
        assert!(w.on_shared_end(base), "the last reference ends it");

        // Its context's end ends every reference.
        w.record_shared(&inv, base, Some(4096), Some(0)).unwrap();
        w.record_shared(&inv, base, Some(4096), Some(0)).unwrap();
        w.end_references(base);
        assert_eq!(w.free_enter(Some(&inv), base).shared, Some(4096));

        // Memory that cannot be described declines launches until its last close.
        let other = 0x8000_0000;
        let _ = w.record_shared(&inv, other, None, Some(0));
        let _ = w.record_shared(&inv, other, None, Some(0));
        w.on_shared_end(other);
        assert!(w.untracked_reason(CTX).is_some(), "still mapped once");
        w.on_shared_end(other);
        assert_eq!(w.untracked_reason(CTX), None);
    }

    #[test]
    fn shared_memory_the_driver_cannot_describe_declines_until_it_ends() {
        let w = MemoryWatch::new();
        let inv = Inventory::new();
        for (size, device) in [(None, Some(0)), (Some(4096), None), (Some(0), Some(0))] {
            let why = w
                .record_shared(&inv, 0x5000_0000, size, device)
                .expect_err("not attributable");
            assert!(!why.is_empty());
            assert!(
                inv.lookup(0x5000_0000).is_none(),
                "never snapshotted in part"
            );
            let reason = w.untracked_reason(CTX).expect("launches decline");
            assert!(reason.contains("shared"), "{reason}");
            assert!(!w.on_shared_end(0x5000_0000), "it was not tracked");
            assert_eq!(w.untracked_reason(CTX), None, "replay resumes once it ends");
        }
        // Ended by cuMemFree too.
        let _ = w.record_shared(&inv, 0x5000_0000, None, None);
        w.on_free(0x5000_0000);
        assert_eq!(w.untracked_reason(CTX), None);
    }

    #[test]
    fn a_graphics_resource_ends_its_mapped_pointer_when_unmapped() {
        let w = MemoryWatch::new();
        w.on_graphics_mapped(0xabc, 0x6000_0000);
        assert_eq!(w.on_graphics_unmapped(0xdef), None);
        assert_eq!(w.on_graphics_unmapped(0xabc), Some(0x6000_0000));
        assert_eq!(w.on_graphics_unmapped(0xabc), None);
    }

    /// A `cuSurfObjectDestroy` forgot its surface at API ENTER, and when the driver refused the
    /// destroy (a handle it does not know, its context not current) the surface stayed
    /// forgotten while still live: kernels writing the array through it were replayed, their
    /// writes repeated by every pass with nothing restoring the array. Now it is live again at
    /// the call's EXIT, unless its context ended or a surface of that handle was made meanwhile.
    #[test]
    fn a_surface_destroy_the_driver_refuses_leaves_launches_declined() {
        let w = MemoryWatch::new();
        w.on_surface_created(5, CTX);
        let destroyed = w.surface_destroy_enter(5).expect("a live surface");
        assert_eq!(w.untracked_reason(CTX), None, "forgotten during the call");
        assert!(w.surface_destroy_failed(destroyed));
        let why = w.untracked_reason(CTX).expect("declined again");
        assert!(why.contains("surface"), "{why}");
        // Destroyed for good: gone; an unknown handle forgets nothing.
        assert!(w.surface_destroy_enter(5).is_some());
        assert_eq!(w.untracked_reason(CTX), None);
        assert!(w.surface_destroy_enter(5).is_none());
        // Its context ended during the failed call: the surface ended with it.
        w.on_surface_created(6, CTX);
        let destroyed = w.surface_destroy_enter(6).unwrap();
        w.on_context_destroyed(CTX);
        assert!(!w.surface_destroy_failed(destroyed));
        assert_eq!(w.untracked_reason(CTX), None);
        // A surface of that handle made meanwhile (in another context) is the live one.
        w.on_surface_created(7, CTX);
        let destroyed = w.surface_destroy_enter(7).unwrap();
        w.on_surface_created(7, CTX + 0x1000);
        assert!(!w.surface_destroy_failed(destroyed));
        assert_eq!(w.untracked_reason(CTX), None);
        assert!(w.untracked_reason(CTX + 0x1000).is_some());
    }

    /// A `cuGraphicsUnmapResources` ended each resource's mapped pointer at API ENTER, and
    /// when the driver refused the unmap the memory stayed forgotten while still mapped:
    /// kernels writing it had their writes repeated by every pass with no restore, and a later
    /// `cuGraphicsResourceGetMappedPointer` of the same mapping counted one reference too few.
    /// Now each mapping is tracked again at the call's EXIT as it was (the same allocation),
    /// with its reference count; an unmap that succeeded ends them as before.
    #[test]
    fn a_graphics_unmap_the_driver_refuses_leaves_its_memory_tracked() {
        let w = MemoryWatch::new();
        let inventory = Inventory::new();
        let (a, b) = (0x6000_0000, 0x7000_0000);
        assert_eq!(w.record_shared(&inventory, a, Some(0x1000), Some(0)), Ok(0));
        w.on_graphics_mapped(0xabc, a);
        // Memory the driver cannot describe declines launches while mapped.
        let _ = w.record_shared(&inventory, b, None, Some(0));
        w.on_graphics_mapped(0xdef, b);
        let generation = inventory.get(a).unwrap().generation;
        let unmapped = w.graphics_unmap_enter(&inventory, &[0xabc, 0xdef, 0x123]);
        assert_eq!(
            unmapped.ended().collect::<Vec<_>>(),
            vec![(a, false, true), (b, false, false)]
        );
        assert!(
            inventory.get(a).is_none(),
            "out of every snapshot during the call"
        );
        assert_eq!(w.untracked_reason(CTX), None);
        // The driver refused it.
        assert_eq!(w.graphics_unmap_failed(&inventory, unmapped), vec![a, b]);
        assert_eq!(inventory.get(a).map(|x| x.generation), Some(generation));
        assert!(w.untracked_reason(CTX).is_some(), "b is mapped again");
        // A later unmap that succeeds ends both, once.
        let unmapped = w.graphics_unmap_enter(&inventory, &[0xabc, 0xdef]);
        assert_eq!(unmapped.ended().count(), 2);
        assert!(inventory.get(a).is_none());
        assert_eq!(w.untracked_reason(CTX), None);
        assert_eq!(
            w.graphics_unmap_enter(&inventory, &[0xabc, 0xdef])
                .ended()
                .count(),
            0
        );
        // A resource mapped anew during a refused unmap keeps its new mapping.
        w.record_shared(&inventory, a, Some(0x1000), Some(0))
            .unwrap();
        w.on_graphics_mapped(0xabc, a);
        let unmapped = w.graphics_unmap_enter(&inventory, &[0xabc]);
        w.record_shared(&inventory, b + 0x1000, Some(0x1000), Some(0))
            .unwrap();
        w.on_graphics_mapped(0xabc, b + 0x1000);
        assert!(w.graphics_unmap_failed(&inventory, unmapped).is_empty());
        assert_eq!(w.on_graphics_unmapped(0xabc), Some(b + 0x1000));

        // Memory opened twice: a refused unmap gives its one reference back, and two ends are
        // still needed to end it.
        let c = 0x9000_0000;
        w.record_shared(&inventory, c, Some(0x1000), Some(0))
            .unwrap();
        w.record_shared(&inventory, c, Some(0x1000), Some(0))
            .unwrap();
        w.on_graphics_mapped(0x456, c);
        let unmapped = w.graphics_unmap_enter(&inventory, &[0x456]);
        assert_eq!(unmapped.ended().collect::<Vec<_>>(), vec![(c, true, false)]);
        assert!(inventory.get(c).is_some(), "one reference is left");
        assert!(w.graphics_unmap_failed(&inventory, unmapped).is_empty());
        assert!(!w.on_shared_end(c), "two references again");
        assert!(w.on_shared_end(c));
    }

    /// A `cuMemFree` forgets the memory at its API ENTER; when the driver then refuses the free
    /// (during another thread's capture, for instance), the memory is still live: it is
    /// tracked again as the same allocation, so a snapshot taken before still restores it and
    /// later snapshots copy it (before: it stayed forgotten, and a kernel writing it lost its
    /// writes to no restore). Managed and shared memory come back the same way.
    #[test]
    fn a_free_that_fails_leaves_the_memory_tracked_as_the_same_allocation() {
        let w = MemoryWatch::new();
        let inventory = Inventory::new();
        let generation = inventory.on_alloc(NewAllocation {
            base: 0x10_0000,
            size: 0x1000,
            owner_agent: 0,
            kind: MemoryKind::CoarseDevice,
        });
        let before = inventory.select(&Filter::for_replay(0));
        let forgotten = w.free_enter(Some(&inventory), 0x10_0000);
        assert_eq!(
            bases_on(&inventory, 0),
            Vec::<u64>::new(),
            "forgotten during the call"
        );
        assert!(w.free_failed(&inventory, forgotten));
        assert_eq!(bases_on(&inventory, 0), vec![0x10_0000]);
        assert_eq!(inventory.get(0x10_0000).unwrap().generation, generation);
        assert!(
            inventory.is_live(&before[0]),
            "the earlier snapshot's region is live again"
        );

        // Managed memory: launches decline again while it is live.
        w.on_managed_alloc(0x20_0000, 4096);
        let forgotten = w.free_enter(Some(&inventory), 0x20_0000);
        assert_eq!(w.untracked_reason(CTX), None);
        assert!(w.free_failed(&inventory, forgotten));
        assert!(w.untracked_reason(CTX).is_some());

        // Shared memory the driver could describe: tracked, and ended by a free, again.
        assert_eq!(
            w.record_shared(&inventory, 0x30_0000, Some(0x2000), Some(1)),
            Ok(1)
        );
        let forgotten = w.free_enter(Some(&inventory), 0x30_0000);
        assert!(w.free_failed(&inventory, forgotten));
        assert_eq!(bases_on(&inventory, 1), vec![0x30_0000]);
        assert_eq!(
            w.free_enter(Some(&inventory), 0x30_0000).shared,
            Some(0x2000)
        );
    }

    /// A `cuMemUnmap` the driver refuses after its API ENTER removed the mappings it covers
    /// (one whole, one cut in part) leaves them mapped: they are tracked again as before, the
    /// writable one in the inventory with its generation, and the cut's remainder is no longer
    /// counted as untracked memory (before: they stayed forgotten, and launches declined for
    /// ever or wrote them with no restore).
    #[test]
    fn an_unmap_that_fails_leaves_its_mappings_tracked_as_before() {
        let w = MemoryWatch::new();
        let inventory = Inventory::new();
        let access = [(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE)];
        for base in [0x10_0000, 0x30_0000] {
            assert_eq!(
                w.record_map(&inventory, base, 0x20_0000, HandleLocation::Device(0)),
                Ok(0)
            );
            w.record_access(&inventory, base, 0x20_0000, &access);
        }
        let generation = inventory.get(0x10_0000).unwrap().generation;
        // The whole first mapping and half of the second.
        let (out, mut undo) = w.unmap_enter(0x10_0000, 0x30_0000);
        assert!(out.partial);
        assert!(
            undo.partial,
            "the cut is told at the unmap's EXIT, once it succeeded"
        );
        for base in out.removed {
            undo.allocations.extend(inventory.on_free(base));
        }
        assert!(
            w.untracked_reason(CTX).is_some(),
            "the cut's rest is untracked"
        );
        w.unmap_failed(&inventory, undo);
        assert_eq!(w.untracked_reason(CTX), None);
        assert_eq!(bases_on(&inventory, 0), vec![0x10_0000, 0x30_0000]);
        assert_eq!(inventory.get(0x10_0000).unwrap().generation, generation);
        assert_eq!(w.mapping_device(0x30_0000), Some(0));
        // A later unmap removes them as usual.
        let out = w.on_unmap(0x10_0000, 0x40_0000);
        assert_eq!(out.removed, vec![0x10_0000, 0x30_0000]);
        assert!(!out.partial);
    }

    /// Two threads free the same address at once (one of them a double free the driver
    /// refuses). A call's API EXIT took whatever ENTER last named the address, whichever thread
    /// made it: the refused free could take what the successful one forgot, and track the
    /// freed memory again, for snapshots and restores to copy.
    #[test]
    fn a_calls_exit_takes_what_its_own_enter_kept_not_another_threads() {
        let calls = std::sync::Arc::new(InFlight::new());
        calls.enter(0x10_0000, Some("this thread's free"));
        let other = calls.clone();
        std::thread::spawn(move || other.enter(0x10_0000, Some("the other thread's free")))
            .join()
            .unwrap();
        assert_eq!(
            calls.exit(0x10_0000, false).back,
            vec![Some("this thread's free")]
        );
        assert!(
            calls.exit(0x10_0000, false).back.is_empty(),
            "nothing else of this thread's"
        );
        let other = calls.clone();
        let theirs = std::thread::spawn(move || other.exit(0x10_0000, true))
            .join()
            .unwrap();
        assert_eq!(theirs.own, Some(Some("the other thread's free")));
        assert!(theirs.back.is_empty());
    }

    /// Two threads unmap overlapping ranges at once: B the range of two mappings, A the second
    /// mapping alone (found already removed by B's API ENTER). The driver unmaps A's and
    /// refuses B's (part of its range is no longer mapped). Calls were kept by their start
    /// address, so A's success said nothing about B's: B's refused EXIT tracked both mappings
    /// again, the one A unmapped included, for snapshots to copy (an illegal address). Now
    /// calls whose ranges overlap name the same mappings: the first mapping is tracked again
    /// (still mapped), the second not, whatever order the EXITs come in; when the driver
    /// refuses both, both are.
    #[test]
    fn a_refused_unmap_overlapping_a_successful_one_puts_back_only_what_is_still_mapped() {
        const M1: u64 = 0x10_0000;
        const M2: u64 = 0x30_0000;
        const SIZE: u64 = 0x20_0000;
        struct Unmaps {
            watch: MemoryWatch,
            inventory: Inventory,
            calls: InFlight<UnmapUndo>,
        }
        impl Unmaps {
            fn enter(&self, base: u64, size: u64) {
                let (out, mut undo) = self.watch.unmap_enter(base, size);
                for b in out.removed {
                    undo.allocations.extend(self.inventory.on_free(b));
                }
                self.calls.enter_range(base, size, undo);
            }
            fn exit(&self, base: u64, refused: bool) {
                for undo in self.calls.exit(base, !refused).back {
                    self.watch.unmap_failed(&self.inventory, undo);
                }
            }
        }
        for (a_refused, a_exits_first) in
            [(false, false), (false, true), (true, false), (true, true)]
        {
            let u = std::sync::Arc::new(Unmaps {
                watch: MemoryWatch::new(),
                inventory: Inventory::new(),
                calls: InFlight::new(),
            });
            let access = [(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE)];
            for base in [M1, M2] {
                u.watch
                    .record_map(&u.inventory, base, SIZE, HandleLocation::Device(0))
                    .unwrap();
                u.watch.record_access(&u.inventory, base, SIZE, &access);
            }
            let (a, b) = (Worker::new(), Worker::new());
            let r = u.clone();
            b.run(move || r.enter(M1, 2 * SIZE));
            let r = u.clone();
            a.run(move || r.enter(M2, SIZE));
            let (ra, rb) = (u.clone(), u.clone());
            let exit_a = move || ra.exit(M2, a_refused);
            let exit_b = move || rb.exit(M1, true);
            if a_exits_first {
                a.run(exit_a);
                b.run(exit_b);
            } else {
                b.run(exit_b);
                a.run(exit_a);
            }
            let case = format!("A refused: {a_refused}, A's EXIT first: {a_exits_first}");
            assert!(u.inventory.get(M1).is_some(), "{case}: M1 is mapped");
            assert_eq!(u.inventory.get(M2).is_some(), a_refused, "{case}: M2");
            assert_eq!(u.watch.mapping_device(M2), a_refused.then_some(0), "{case}");
            assert_eq!(u.watch.untracked_reason(CTX), None, "{case}");
        }
    }

    /// A `cuMemFree` whose API ENTER forgot the allocation, then refused by the driver because
    /// another thread destroyed the allocation's context meanwhile (`cuCtxDestroy`,
    /// `cudaDeviceReset`), put the allocation back at its EXIT: memory that ended with its
    /// context stayed in the inventory, and the next snapshot of its device copied freed
    /// memory (an illegal address that poisons the new context). The EXIT (as `inject`'s
    /// `free_exit` makes it) now puts back nothing whose context ended since its ENTER; a
    /// refused free in a live context still does.
    #[test]
    fn a_refused_free_after_its_context_ended_puts_nothing_back() {
        use crate::contexts::{Contexts, FreedIn};
        const OWNER: usize = 0xc7;
        let w = MemoryWatch::new();
        let inventory = Inventory::new();
        let contexts = Contexts::default();
        let frees: InFlight<(Forgotten, Option<FreedIn>)> = InFlight::new();
        let alloc = |base| {
            inventory.on_alloc(NewAllocation {
                base,
                size: 0x1000,
                owner_agent: 0,
                kind: MemoryKind::CoarseDevice,
            });
            contexts.note_allocation(OWNER, base);
        };
        let enter = |base| {
            let owner = contexts.note_free_in(base);
            frees.enter(base, (w.free_enter(Some(&inventory), base), owner));
        };
        // `inject`'s `free_exit` of a refused free.
        let refused = |base| {
            for (forgotten, owner) in frees.exit(base, false).back {
                if owner.is_some_and(|o| contexts.ended_since(&o)) {
                    continue;
                }
                if w.free_failed(&inventory, forgotten)
                    && let Some(o) = owner
                {
                    contexts.note_allocation(o.ctx, base);
                }
            }
        };
        alloc(0x10_0000);
        enter(0x10_0000);
        // The context ends while the free is in the driver.
        assert_eq!(contexts.forget(OWNER), Vec::<u64>::new());
        w.on_context_destroyed(OWNER);
        refused(0x10_0000);
        assert_eq!(
            inventory.get(0x10_0000),
            None,
            "freed memory is tracked again"
        );
        // A new context of the same handle: a refused free there puts its allocation back.
        alloc(0x20_0000);
        enter(0x20_0000);
        refused(0x20_0000);
        assert!(inventory.get(0x20_0000).is_some());
        assert_eq!(
            contexts.forget(OWNER),
            vec![0x20_0000],
            "it ends with its context"
        );
    }

    /// A free that failed puts nothing back over memory the application allocated meanwhile
    /// at the same place (what the driver handed out is live, the old entry is not).
    #[test]
    fn a_failed_free_never_overwrites_an_allocation_made_since() {
        let w = MemoryWatch::new();
        let inventory = Inventory::new();
        inventory.on_alloc(NewAllocation {
            base: 0x10_0000,
            size: 0x1000,
            owner_agent: 0,
            kind: MemoryKind::CoarseDevice,
        });
        let forgotten = w.free_enter(Some(&inventory), 0x10_0000);
        let newer = inventory.on_alloc(NewAllocation {
            base: 0x10_0800,
            size: 0x1000,
            owner_agent: 0,
            kind: MemoryKind::CoarseDevice,
        });
        assert!(!w.free_failed(&inventory, forgotten));
        assert_eq!(bases_on(&inventory, 0), vec![0x10_0800]);
        assert_eq!(inventory.get(0x10_0800).unwrap().generation, newer);
        // Nothing was forgotten: nothing to put back.
        assert!(!w.free_failed(&inventory, w.free_enter(Some(&inventory), 0x50_0000)));
    }

    #[test]
    fn a_live_managed_allocation_blocks_replay_until_it_is_freed() {
        let w = MemoryWatch::new();
        assert_eq!(w.untracked_reason(CTX), None);
        w.on_managed_alloc(0x1000, 4096);
        let why = w.untracked_reason(CTX).expect("declined");
        assert!(why.contains("managed"), "{why}");
        assert!(!w.on_free(0x2000), "not a managed allocation");
        assert!(w.untracked_reason(CTX).is_some());
        assert!(w.on_free(0x1000));
        assert_eq!(w.untracked_reason(CTX), None);
    }

    #[test]
    fn mappings_on_a_known_device_are_tracked_and_removed_by_their_unmap() {
        let w = MemoryWatch::new();
        assert!(w.on_map(0x10_0000, 0x20_0000, Some(0)));
        assert!(w.on_map(0x30_0000, 0x20_0000, Some(0)));
        assert_eq!(
            w.untracked_reason(CTX),
            None,
            "tracked mappings are snapshotted"
        );
        // One unmap over both mappings (PyTorch unmaps whole segments).
        let out = w.on_unmap(0x10_0000, 0x40_0000);
        assert_eq!(
            out,
            Unmapped {
                removed: vec![0x10_0000, 0x30_0000],
                partial: false
            }
        );
        assert_eq!(w.on_unmap(0x10_0000, 0x40_0000), Unmapped::default());
    }

    #[test]
    fn a_mapping_of_unknown_device_or_cut_in_part_declines_until_unmapped() {
        let w = MemoryWatch::new();
        assert!(!w.on_map(0x10_0000, 0x1000, None));
        assert!(
            w.untracked_reason(CTX)
                .unwrap()
                .contains("cannot attribute")
        );
        w.on_unmap(0x10_0000, 0x1000);
        assert_eq!(w.untracked_reason(CTX), None);

        assert!(w.on_map(0x20_0000, 0x3000, Some(1)));
        let out = w.on_unmap(0x20_1000, 0x1000);
        assert_eq!(out.removed, vec![0x20_0000]);
        assert!(out.partial);
        assert!(
            w.untracked_reason(CTX).is_some(),
            "the rest is not described"
        );
        w.on_unmap(0x20_0000, 0x1000);
        assert!(
            w.untracked_reason(CTX).is_some(),
            "the tail is still mapped"
        );
        w.on_unmap(0x20_2000, 0x1000);
        assert_eq!(w.untracked_reason(CTX), None);
    }
}
