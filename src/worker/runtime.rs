//! Runtime construction and CPU pinning.
//!
//! The driver is chosen once, on the starting thread: io_uring when the kernel offers every
//! operation monoio needs and a full-size ring can be built, else the epoll fallback (logged
//! once). `MONOIO_FORCE_LEGACY_DRIVER=1` forces the fallback (monoio reads it).

use std::io;

use monoio::time::TimeDriver;
use monoio::{IoUringDriver, LegacyDriver, RuntimeBuilder};

use crate::config::CpuPinning;
use crate::shared::DriverKind;

/// Submission queue entries per worker ring.
pub const RING_ENTRIES: u32 = 4096;

/// A worker runtime on either driver.
pub type Runtime = monoio::FusionRuntime<TimeDriver<IoUringDriver>, TimeDriver<LegacyDriver>>;

/// Decides the driver for every worker of this process.
///
/// The probe runs on a short-lived thread of its own: tearing a ring down queues task work on
/// the thread that created it, which interrupts that thread's blocking calls (`EINTR` on a
/// socket with a receive timeout); the caller must not be that thread.
pub fn choose_driver() -> DriverKind {
    std::thread::Builder::new()
        .name("ringway-probe".into())
        .spawn(probe_driver)
        .ok()
        .and_then(|h| h.join().ok())
        .unwrap_or(DriverKind::Epoll)
}

fn probe_driver() -> DriverKind {
    if !monoio::utils::detect_uring() {
        return DriverKind::Epoll;
    }
    match build(DriverKind::IoUring) {
        Ok(_) => DriverKind::IoUring,
        Err(e) => {
            tracing::warn!(error = %e, "io_uring is present but a ring cannot be built; using epoll");
            DriverKind::Epoll
        }
    }
}

/// Builds a runtime on `driver`, with timers.
pub fn build(driver: DriverKind) -> io::Result<Runtime> {
    Ok(match driver {
        DriverKind::IoUring => RuntimeBuilder::<IoUringDriver>::new()
            .enable_timer()
            .with_entries(RING_ENTRIES)
            .build()?
            .into(),
        DriverKind::Epoll => RuntimeBuilder::<LegacyDriver>::new()
            .enable_timer()
            .build()?
            .into(),
    })
}

/// Pins the calling thread for worker `index` as `pinning` says. Returns the CPU pinned to.
pub fn pin(index: usize, pinning: &CpuPinning) -> Option<usize> {
    let available = core_affinity::get_core_ids().unwrap_or_default();
    let wanted = match pinning {
        CpuPinning::Off => return None,
        CpuPinning::PerWorker => available.get(index % available.len().max(1))?.id,
        CpuPinning::List(cpus) => *cpus.get(index % cpus.len().max(1))?,
    };
    let core = available.into_iter().find(|c| c.id == wanted)?;
    core_affinity::set_for_current(core).then_some(wanted)
}
