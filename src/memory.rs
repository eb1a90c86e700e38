//! Returning freed heap memory to the operating system.

/// Hands freed heap memory back to the OS. A refresh allocates and frees a whole candidate
/// (probed catalogs, candidate view, canonical items), and a child dropped for an oversized frame
/// leaves its read buffer (up to the frame bound) behind; glibc keeps such freed memory in its
/// per-thread heaps, so without this the process would stay at the high-water mark (measured:
/// +100 MB at 20k tools, back to +8 % after trimming). Not needed with other allocators.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap pages to the kernel; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Makes glibc return large buffers to the system when they are freed.
///
/// glibc serves allocations above its mmap threshold (128 KiB) with their own mappings and
/// unmaps them on free — but the first such free raises the threshold to that size (up to
/// 32 MiB), after which equally large request bodies (a 3.5 MB `initialize`, collected by the
/// front and again by rmcp) come from the arenas and stay resident after they are freed: 100
/// refused requests left ~30 MB behind. A fixed threshold turns the dynamic adjustment off, so a
/// burst of large bodies costs memory only while they are being read.
pub fn bound_allocator_retention() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; called first thing in main, before any
    // other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 * 1024);
    }
}

/// Asks for [`release_free_memory`] soon: a large request body (and rmcp's copy of it) was just
/// freed. The request bodies a front reads arrive in small chunks that glibc serves from its
/// arenas, so a burst of large bodies (refused or not) would leave the process at its high-water
/// mark. Trailing and coalesced: one trim at most every second, after the burst.
pub fn large_buffer_freed() {
    use std::sync::atomic::{AtomicBool, Ordering};
    static WANTED: AtomicBool = AtomicBool::new(false);
    static TRIMMER: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    WANTED.store(true, Ordering::Relaxed);
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    TRIMMER.get_or_init(|| {
        rt.spawn(async {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if WANTED.swap(false, Ordering::Relaxed) {
                    let _ = tokio::task::spawn_blocking(release_free_memory).await;
                }
            }
        });
    });
}
