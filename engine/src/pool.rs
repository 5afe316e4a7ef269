//! Persistent worker threads for the token loop. A forward pass is a few hundred short parallel
//! regions per token; waking sleeping threads for each (what a general-purpose pool does when
//! it runs dry) costs more than the region itself. These workers spin between regions and
//! sleep only after a millisecond without work, so a region starts in well under a microsecond
//! during generation and an idle engine does not burn a core.
//!
//! The caller always takes part as thread 0, and `run` returns only when every worker has
//! finished, which is what makes lending the job's borrows to the workers sound.

use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The live shared pools by thread count.
type Registry = Vec<(usize, Weak<Pool>)>;

/// A job as the workers see it: `job(thread_index)`.
type Job = dyn Fn(usize) + Sync;

/// How long an idle worker spins before it sleeps.
const SPIN: Duration = Duration::from_millis(1);

struct Shared {
    /// Bumped once per region; workers run the job when it changes.
    epoch: AtomicUsize,
    /// The current region's job, with its lifetime erased (see `Pool::run`).
    job: Mutex<Option<&'static Job>>,
    /// Workers still running the current region.
    pending: AtomicUsize,
    /// A worker's job panicked in the current region.
    panicked: AtomicBool,
    stop: AtomicBool,
    /// Workers asleep on `wake` (checked by the dispatcher after it bumps the epoch).
    sleepers: AtomicUsize,
    sleep: Mutex<()>,
    wake: Condvar,
}

/// A fixed set of threads that run parallel regions together with the calling thread.
pub struct Pool {
    threads: usize,
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// One region at a time: `run` from two threads at once waits its turn.
    dispatch: Mutex<()>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("threads", &self.threads)
            .finish()
    }
}

impl Pool {
    /// A pool of `threads` threads in all: the caller plus `threads − 1` workers (fewer if the
    /// system refuses to start more).
    pub fn new(threads: usize) -> Pool {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            job: Mutex::new(None),
            pending: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut workers = Vec::with_capacity(threads - 1);
        for index in 1..threads {
            let worker_shared = Arc::clone(&shared);
            match std::thread::Builder::new()
                .name(format!("engine-worker-{index}"))
                .spawn(move || work(&worker_shared, index))
            {
                Ok(handle) => workers.push(handle),
                // Out of threads: run with the ones we have rather than fail the request.
                Err(_) => break,
            }
        }
        Pool {
            threads: workers.len() + 1,
            shared,
            workers,
            dispatch: Mutex::new(()),
        }
    }

    /// The process-wide pool of `threads` threads, created on first use and shared while
    /// anyone holds it.
    pub fn shared(threads: usize) -> Arc<Pool> {
        static POOLS: OnceLock<Mutex<Registry>> = OnceLock::new();
        let pools = POOLS.get_or_init(|| Mutex::new(Vec::new()));
        let mut pools = pools.lock().unwrap_or_else(|e| e.into_inner());
        pools.retain(|(_, weak)| weak.strong_count() > 0);
        let wanted = threads.max(1);
        if let Some(pool) = pools
            .iter()
            .find(|(n, _)| *n == wanted)
            .and_then(|(_, weak)| weak.upgrade())
        {
            return pool;
        }
        // Keyed by the count asked for, even if the system granted fewer threads.
        let pool = Arc::new(Pool::new(wanted));
        pools.push((wanted, Arc::downgrade(&pool)));
        pool
    }

    /// Threads in all, the caller included.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `job(i)` for every thread index `i` in `0..threads()`, the caller doing `i = 0`,
    /// and returns when all are done. A panic in any of them is re-raised here.
    pub fn run<'a>(&self, job: &'a (dyn Fn(usize) + Sync + 'a)) {
        if self.threads == 1 {
            job(0);
            return;
        }
        let _turn = self.dispatch.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        // SAFETY: the erased reference is only used by workers between the epoch bump below
        // and their decrement of `pending`; this function does not return (or unwind) before
        // `pending` is zero and the slot is cleared, so `job` outlives every use.
        let erased: &'static Job =
            unsafe { std::mem::transmute::<&'a (dyn Fn(usize) + Sync + 'a), &'static Job>(job) };
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(erased);
        s.panicked.store(false, Ordering::Relaxed);
        s.pending.store(self.threads - 1, Ordering::SeqCst);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| job(0)));
        let mut spins = 0u32;
        while s.pending.load(Ordering::Acquire) != 0 {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(4096) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if let Err(panic) = mine {
            std::panic::resume_unwind(panic);
        }
        if s.panicked.load(Ordering::Acquire) {
            panic!("an engine worker thread panicked");
        }
    }

    /// Splits each slice of `outs` — `columns` columns of equal length, one after another —
    /// into ranges of rows (boundaries on multiples of `align`), and runs
    /// `job(slice_index, share)` for every range of every slice in one region. So products
    /// that read the same input (query, key and value) cost one synchronisation.
    /// [`Schedule::Even`] gives each thread one contiguous range per slice (the same rows
    /// every time, so its weights stay in its cache); [`Schedule::Claimed`] lets threads claim
    /// `align`-row ranges until none are left, so a thread slowed down by anything else on
    /// its core does not hold the others back.
    pub fn for_each_share<T: Send>(
        &self,
        outs: &mut [&mut [T]],
        columns: usize,
        align: usize,
        schedule: Schedule,
        job: &(dyn Fn(usize, Share<'_, T>) + Sync),
    ) {
        const MAX: usize = 16;
        let align = align.max(1);
        let columns = columns.max(1);
        let threads = self.threads;
        for (group, chunk) in outs.chunks_mut(MAX).enumerate() {
            let mut bases = [(SendPtr(std::ptr::null_mut()), 0usize); MAX];
            for (slot, out) in bases.iter_mut().zip(chunk.iter_mut()) {
                assert_eq!(out.len() % columns, 0, "a slice of {columns} equal columns");
                *slot = (SendPtr(out.as_mut_ptr()), out.len() / columns);
            }
            let used = chunk.len();
            if schedule == Schedule::Claimed {
                let units: [usize; MAX] = std::array::from_fn(|k| bases[k].1.div_ceil(align));
                let total: usize = units.iter().sum();
                let next = AtomicUsize::new(0);
                self.run(&|_| {
                    loop {
                        let mut unit = next.fetch_add(1, Ordering::Relaxed);
                        if unit >= total {
                            return;
                        }
                        let mut k = 0;
                        while unit >= units[k] {
                            unit -= units[k];
                            k += 1;
                        }
                        let (base, rows) = bases[k];
                        let share = Share {
                            base,
                            rows,
                            columns,
                            start: unit * align,
                            end: ((unit + 1) * align).min(rows),
                            _borrow: PhantomData,
                        };
                        job(group * MAX + k, share);
                    }
                });
                continue;
            }
            self.run(&|i| {
                for (k, &(base, rows)) in bases[..used].iter().enumerate() {
                    let units = rows.div_ceil(align);
                    let bound = |t: usize| (units * t / threads * align).min(rows);
                    let (start, end) = (bound(i), bound(i + 1));
                    if start < end {
                        let share = Share {
                            base,
                            rows,
                            columns,
                            start,
                            end,
                            _borrow: PhantomData,
                        };
                        job(group * MAX + k, share);
                    }
                }
            });
        }
    }
}

/// How [`Pool::for_each_share`] divides rows among threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// One contiguous range per thread.
    Even,
    /// Ranges of `align` rows, claimed by whichever thread is free.
    Claimed,
}

/// One thread's rows `[start, end)` of every column of a slice being filled in parallel.
pub struct Share<'a, T> {
    base: SendPtr<T>,
    rows: usize,
    columns: usize,
    /// First row of the share.
    pub start: usize,
    /// One past its last row.
    pub end: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

impl<T> Share<'_, T> {
    /// Columns in the slice.
    pub fn columns(&self) -> usize {
        self.columns
    }

    /// This share's rows of column `c`.
    pub fn column(&mut self, c: usize) -> &mut [T] {
        assert!(c < self.columns, "column {c} of {}", self.columns);
        // SAFETY: `for_each_share` hands out disjoint row ranges [start, end) inside
        // every column of a slice it holds exclusively for the whole region, and `&mut self`
        // allows one column view at a time per share.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.base.get().add(c * self.rows + self.start),
                self.end - self.start,
            )
        }
    }
}

/// A raw pointer that may cross threads: `for_each_share` hands each thread a disjoint range.
struct SendPtr<T>(*mut T);

impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for SendPtr<T> {}

impl<T> SendPtr<T> {
    fn get(self) -> *mut T {
        self.0
    }
}

// SAFETY: only used to rebuild disjoint sub-slices of a slice of `T: Send` (see above).
unsafe impl<T: Send> Send for SendPtr<T> {}
// SAFETY: as above; the pointer itself is only read.
unsafe impl<T: Send> Sync for SendPtr<T> {}

impl Drop for Pool {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.stop.store(true, Ordering::SeqCst);
        {
            let _guard = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

/// Counts a worker out of the current region when dropped.
struct Done<'a>(&'a AtomicUsize);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

fn work(s: &Shared, index: usize) {
    let mut seen = 0usize;
    loop {
        let mut idle_since = Instant::now();
        let mut spins = 0u32;
        loop {
            let epoch = s.epoch.load(Ordering::SeqCst);
            if epoch != seen {
                seen = epoch;
                break;
            }
            if s.stop.load(Ordering::SeqCst) {
                return;
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(1024) || idle_since.elapsed() < SPIN {
                std::hint::spin_loop();
                continue;
            }
            let guard = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            s.sleepers.fetch_add(1, Ordering::SeqCst);
            if s.epoch.load(Ordering::SeqCst) == seen && !s.stop.load(Ordering::SeqCst) {
                let _guard = s.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
            }
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
            idle_since = Instant::now();
        }
        // However this region ends for this thread, the caller must hear that it did.
        let _done = Done(&s.pending);
        let job = *s.job.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(job) = job
            && catch_unwind(AssertUnwindSafe(|| job(index))).is_err()
        {
            s.panicked.store(true, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_index_runs_once_per_region() {
        let pool = Pool::new(3);
        let counts: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
        for _ in 0..1000 {
            pool.run(&|i| {
                counts[i].fetch_add(1, Ordering::Relaxed);
            });
        }
        assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1000));
    }

    #[test]
    fn shares_cover_every_column_once_on_aligned_boundaries() {
        for threads in 1..=4 {
            let pool = Pool::new(threads);
            let cases = [(0, 1), (1, 1), (2, 3), (7, 2), (64, 1), (577, 5)];
            for ((rows, columns), schedule) in cases
                .into_iter()
                .flat_map(|case| [(case, Schedule::Even), (case, Schedule::Claimed)])
            {
                let mut a = vec![0u32; rows * columns];
                let mut b = vec![0u32; rows * columns];
                let outs: &mut [&mut [u32]] = &mut [&mut a, &mut b];
                pool.for_each_share(outs, columns, 2, schedule, &|which, mut share| {
                    assert_eq!(share.start % 2, 0);
                    let start = share.start;
                    for c in 0..share.columns() {
                        for (k, v) in share.column(c).iter_mut().enumerate() {
                            *v += (which * 100_000 + c * 1000 + start + k) as u32 + 1;
                        }
                    }
                });
                for (which, out) in [a, b].iter().enumerate() {
                    assert!(out.iter().enumerate().all(|(i, &v)| {
                        v == (which * 100_000 + (i / rows) * 1000 + i % rows) as u32 + 1
                    }));
                }
            }
        }
    }

    #[test]
    fn a_worker_panic_reaches_the_caller_and_the_pool_goes_on() {
        let pool = Pool::new(2);
        let result = catch_unwind(AssertUnwindSafe(|| {
            pool.run(&|i| assert!(i != 1, "worker fails"));
        }));
        assert!(result.is_err());
        let ran = AtomicUsize::new(0);
        pool.run(&|_| {
            ran.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(ran.load(Ordering::Relaxed), 2);
    }

    /// The kernel's view of thread `tid` of this process: its scheduling state (`R` running or
    /// runnable, `S` asleep, ...) and the CPU time it has used, in clock ticks.
    #[cfg(target_os = "linux")]
    fn kernel_view(tid: &str) -> (char, u64) {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).expect("stat");
        // The name in parentheses may hold spaces; the fields after it do not.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .expect("comm")
            .1
            .split_whitespace()
            .collect();
        let state = fields[0].chars().next().expect("state");
        // utime and stime: fields 14 and 15 of stat(5), the 12th and 13th after the name.
        let ticks =
            fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
        (state, ticks)
    }

    /// Workers that spun through their millisecond really go to sleep: the kernel reports
    /// them asleep and using no CPU, not merely the pool's own count.
    #[test]
    #[cfg(target_os = "linux")]
    fn idle_workers_stop_spinning_and_sleep() {
        let pool = Pool::new(3);
        let tids: Vec<Mutex<String>> = (0..3).map(|_| Mutex::new(String::new())).collect();
        pool.run(&|i| {
            let me = std::fs::read_link("/proc/thread-self").expect("thread-self");
            let tid = me.file_name().expect("tid").to_string_lossy().into_owned();
            *tids[i].lock().expect("tid") = tid;
        });
        let workers: Vec<String> = tids[1..]
            .iter()
            .map(|t| t.lock().expect("tid").clone())
            .collect();
        let deadline = Instant::now() + Duration::from_secs(5);
        let states = loop {
            let states: Vec<(char, u64)> = workers.iter().map(|t| kernel_view(t)).collect();
            let asleep = pool.shared.sleepers.load(Ordering::SeqCst);
            if asleep == workers.len() && states.iter().all(|&(state, _)| state == 'S') {
                break states;
            }
            assert!(
                Instant::now() < deadline,
                "idle workers still awake after 5 s: {asleep} counted asleep, states {states:?}"
            );
            std::thread::sleep(SPIN);
        };
        // A spinning thread would use every tick of this.
        std::thread::sleep(Duration::from_millis(200));
        let later: Vec<(char, u64)> = workers.iter().map(|t| kernel_view(t)).collect();
        assert_eq!(later, states, "asleep workers used CPU time");
        let ran = AtomicUsize::new(0);
        pool.run(&|_| {
            ran.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(
            ran.load(Ordering::Relaxed),
            3,
            "every sleeper woke for the region"
        );
    }

    #[test]
    fn idle_workers_sleep_and_wake_for_the_next_region() {
        let pool = Pool::new(2);
        std::thread::sleep(SPIN * 5);
        let ran = AtomicUsize::new(0);
        pool.run(&|_| {
            ran.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(ran.load(Ordering::Relaxed), 2);
    }
}
