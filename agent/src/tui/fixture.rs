//! A synthetic model for the view tests: a pod with two training processes (one drifting, one
//! doing NCCL), a docker container squeezed by its limit (allocations denied, throttled), one with
//! an unlimited region on a device without per-process utilisation (MIG), and a host process
//! without a limiter. [`two_gpus`] is a node whose containers use both of its GPUs.

pub mod two_gpus;

use std::collections::BTreeMap;

use agent_common::hist::{HIST_BUCKETS, bucket_of};

use crate::model::{
    AgentStatus, ApiUsage, Container, FoundBy, GpuDevice, LibraryStatus, LimiterProcess,
    MemoryViews, NvmlProcess, Process, ProcessKey, Rates, RegionDevice, RegionInfo, Snapshot,
    Source,
    gpu_use::{Busy, KernelTime, LimiterGpuTime, UseWindow},
    probing::{AttachMode, LaunchProbes, ProbeCost, Prologue},
};

pub const TRAIN_ID: &str = "605439acbd4fb18c145069289094b17f17e0cfa938f78012d4960bc797305f22";
pub const SQUEEZED_ID: &str = "7951fb549ab99e0722a949b6c121634e1f3a36b5bacbe5392991e3b12251e6b8";
pub const UNLIMITED_ID: &str = "c0ffee549ab99e0722a949b6c121634e1f3a36b5bacbe5392991e3b12251e6b8";
const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
/// The trainer pod's SM use: 62% + 20%.
pub const TRAIN_SM_PCT: u64 = 82;

/// NVML's view of a process on device 0 over the latest second; `None`: the device gives no
/// per-process utilisation (MIG).
fn nvml(used: u64, sm_mem: Option<(f64, f64)>) -> Vec<NvmlProcess> {
    let window = UseWindow {
        from_unix_us: 1_779_999_999_000_000,
        to_unix_us: 1_780_000_000_000_000,
        sample_period_us: 166_666,
    };
    vec![NvmlProcess {
        device: 0,
        used_memory: Some(used),
        sm_util_pct: sm_mem.map(|u| u.0),
        mem_util_pct: sm_mem.map(|u| u.1),
        use_window: sm_mem.map(|_| window),
        use_unavailable: sm_mem.is_none().then(|| {
            "not supported on this device (MIG mode, a vGPU guest or an older GPU)".into()
        }),
        busy: sm_mem.map_or(Busy::default(), |(sm, mem)| Busy {
            sm_us: (sm * 600_000.0) as u64,
            mem_us: (mem * 600_000.0) as u64,
            observed_us: 60_000_000,
        }),
    }]
}

fn hist(samples: &[(u64, u64)]) -> Vec<u64> {
    let mut h = vec![0; HIST_BUCKETS];
    for (ns, n) in samples {
        h[bucket_of(*ns)] += n;
    }
    h
}

fn api(name: &str, kind: &str, source: Source, samples: &[(u64, u64)]) -> ApiUsage {
    let calls = samples.iter().map(|s| s.1).sum();
    ApiUsage {
        api: name.into(),
        kind: kind.into(),
        source,
        calls,
        errors: 0,
        bytes: 0,
        total_ns: samples.iter().map(|(ns, n)| ns * n).sum(),
        hook_ns: if source == Source::Limiter {
            calls * 45
        } else {
            0
        },
        denied: 0,
        hist: hist(samples),
        latency: None,
        probed: None,
    }
}

fn process(pid: u32, comm: &str, cmdline: &str, container: &str) -> Process {
    Process {
        key: ProcessKey {
            pid,
            start_ticks: 1000 + pid as u64,
        },
        alive: true,
        comm: comm.into(),
        cmdline: cmdline.into(),
        container: container.into(),
        cgroup_path: None,
        memory: MemoryViews::default(),
        apis: vec![],
        limiter: None,
        nvml: vec![],
        communicators: vec![],
        alloc_sizes: vec![],
        rates: Some(Rates::default()),
        probe_losses: Default::default(),
        probe_seconds: None,
    }
}

fn limiter(held: u64, throttled_ns: u64) -> LimiterProcess {
    LimiterProcess {
        region: "/run/vgpu/regions/x.cache".into(),
        slot: 0,
        held: vec![held],
        context_bytes: vec![500 * MIB],
        throttled_ns,
        dropped_records: 0,
        shard_problems: vec![],
        ..Default::default()
    }
}

fn region(limit: u64, reserved: u64, denied: u64) -> RegionInfo {
    RegionInfo {
        path: "/run/vgpu/regions/x.cache".into(),
        format: "vgpu".into(),
        devices: vec![RegionDevice {
            index: 0,
            memory_limit: limit,
            sm_limit_pct: 0,
            reserved,
            denied,
            context_charge: Some(500 * MIB),
            qos: None,
        }],
        problems: vec![],
        read_retries: 0,
        writable_by_others: None,
        freeze_after_seconds: None,
    }
}

fn container(key: &str, name: &str, procs: &[&Process], regions: Vec<RegionInfo>) -> Container {
    Container {
        key: key.into(),
        name: name.into(),
        containerised: key != "host",
        runtime: (key != "host").then(|| "docker".into()),
        container_id: (key != "host").then(|| key.into()),
        pod_uid: None,
        pod_name: None,
        namespace: None,
        qos: None,
        processes: procs.iter().map(|p| p.key).collect(),
        regions,
        probe_losses: Default::default(),
        frozen: None,
    }
}

/// Processes 4101 and 4102 (pod ml-team/trainer-0), 5200 (llm-serve, squeezed), 6300 (notebook,
/// unlimited), 777 (a host process).
pub fn snapshot() -> Snapshot {
    let mut rank0 = process(
        4101,
        "python3",
        "python3 train.py --model llama-8b --rank 0",
        TRAIN_ID,
    );
    rank0.apis = vec![
        api(
            "cuLaunchKernel",
            "launch",
            Source::Limiter,
            &[(3_000, 90_000), (6_000, 9_000), (40_000, 1_000)],
        ),
        api(
            "cuMemAlloc_v2",
            "alloc",
            Source::Probes,
            &[(20_000, 300), (900_000, 4)],
        ),
        api(
            "cuStreamSynchronize",
            "sync",
            Source::Probes,
            &[(2_000_000, 500), (9_000_000, 20)],
        ),
    ];
    rank0.limiter = Some(LimiterProcess {
        gpu_time: vec![LimiterGpuTime {
            device: 0,
            estimated_ns: 41_000_000_000,
            sampled_ns: 180_000_000,
            samples: 12_000,
            launches: 2_400_000,
            busy_ratio: Some(0.34),
        }],
        // (name, GPU time, mean time per launch).
        kernels: [
            (
                "ampere_bf16_s16816gemm_bf16_256x128_ldg8_f2f_stages_64x3_tn",
                24_600_000_000,
                120_000,
            ),
            ("flash_fwd_kernel", 9_800_000_000, 49_000),
            ("graph", 4_100_000_000, 2_050_000),
            ("other", 2_500_000_000, 8_000),
        ]
        .into_iter()
        .map(|(name, ns, mean_ns)| KernelTime {
            name: name.into(),
            truncated: false,
            estimated_ns: ns,
            samples: ns / 3_400_000,
            launches: ns / mean_ns,
        })
        .collect(),
        ..limiter(4 * GIB, 0)
    });
    rank0.nvml = nvml(5 * GIB, Some((62.0, 31.0)));
    rank0.memory = MemoryViews {
        limiter: Some(4 * GIB),
        limiter_allocations: Some(3 * GIB + 512 * MIB),
        nvml: Some(5 * GIB),
        ..MemoryViews::default()
    }
    .reconcile();
    rank0.rates = Some(Rates {
        allocations_per_s: 12.0,
        launches_per_s: 9_400.0,
        calls_per_s: 9_800.0,
        nccl_bytes_per_s: 0.0,
        sync_share: 0.31,
        throttled_share: 0.0,
        denied_per_s: 0.0,
    });
    let mut rank1 = process(
        4102,
        "python3",
        "python3 -m nccl_bench.all_reduce --size 256M",
        TRAIN_ID,
    );
    rank1.apis = vec![
        api(
            "ncclAllReduce",
            "nccl",
            Source::Probes,
            &[(150_000, 800), (1_500_000, 10)],
        ),
        api(
            "cuLaunchKernel",
            "launch",
            Source::Limiter,
            &[(3_000, 20_000)],
        ),
    ];
    rank1.apis[0].bytes = 810 * 256 * MIB;
    rank1.limiter = Some(limiter(2 * GIB, 0));
    rank1.nvml = nvml(2 * GIB + 10 * MIB, Some((20.0, 44.0)));
    rank1.memory = MemoryViews {
        limiter: Some(2 * GIB),
        nvml: Some(2 * GIB + 10 * MIB),
        ..MemoryViews::default()
    }
    .reconcile();
    rank1.rates = Some(Rates {
        allocations_per_s: 0.5,
        launches_per_s: 2_000.0,
        calls_per_s: 2_100.0,
        nccl_bytes_per_s: 21.5 * GIB as f64,
        sync_share: 0.05,
        throttled_share: 0.0,
        denied_per_s: 0.0,
    });

    let mut serve = process(
        5200,
        "vllm",
        "vllm serve meta-llama/Llama-3-8B --port 8000",
        SQUEEZED_ID,
    );
    let mut alloc = api(
        "cuMemAlloc_v2",
        "alloc",
        Source::Limiter,
        &[(8_000, 2_000), (120_000, 40)],
    );
    alloc.denied = 40;
    alloc.errors = 40;
    serve.apis = vec![
        alloc,
        api("cuMemFree_v2", "free", Source::Limiter, &[(5_000, 1_950)]),
    ];
    serve.limiter = Some(limiter(2 * GIB - 64 * MIB, 2_500_000_000));
    serve.nvml = nvml(2 * GIB - 60 * MIB, Some((30.0, 9.0)));
    serve.memory = MemoryViews {
        limiter: Some(2 * GIB - 64 * MIB),
        nvml: Some(2 * GIB - 60 * MIB),
        ..MemoryViews::default()
    }
    .reconcile();
    serve.rates = Some(Rates {
        allocations_per_s: 85.0,
        launches_per_s: 0.0,
        calls_per_s: 170.0,
        nccl_bytes_per_s: 0.0,
        sync_share: 0.0,
        throttled_share: 0.12,
        denied_per_s: 4.0,
    });

    let mut notebook = process(
        6300,
        "jupyter",
        "/opt/conda/bin/python -m ipykernel_launcher",
        UNLIMITED_ID,
    );
    notebook.apis = vec![api(
        "cuMemAlloc_v2",
        "alloc",
        Source::Limiter,
        &[(15_000, 12)],
    )];
    notebook.memory = MemoryViews {
        limiter: Some(700 * MIB),
        ..MemoryViews::default()
    };
    notebook.rates = None;
    notebook.nvml = nvml(700 * MIB, None);

    let mut blender = process(777, "blender", "/usr/bin/blender -b scene.blend -a", "host");
    // Its synchronisations sampled under the probe budget: 100 estimated from the 25 probed.
    let mut sync = api(
        "cuStreamSynchronize",
        "sync",
        Source::Probes,
        &[(50_000, 100)],
    );
    sync.probed = Some(crate::model::Probed {
        calls: 25,
        errors: 0,
        bytes: 0,
        total_ns: 25 * 50_000,
    });
    blender.apis = vec![
        api("cuMemAlloc_v2", "alloc", Source::Probes, &[(30_000, 64)]),
        sync,
    ];
    blender.memory = MemoryViews {
        probes: Some(2 * GIB + 512 * MIB),
        nvml: Some(3 * GIB),
        ..MemoryViews::default()
    }
    .reconcile();
    blender.nvml = nvml(3 * GIB, Some((4.0, 1.0)));
    blender.rates = Some(Rates {
        allocations_per_s: 2.0,
        ..Rates::default()
    });

    let mut train = container(
        TRAIN_ID,
        "pytorch",
        &[&rank0, &rank1],
        vec![region(8 * GIB, 6 * GIB, 0)],
    );
    train.runtime = Some("containerd".into());
    train.pod_name = Some("trainer-0".into());
    train.namespace = Some("ml-team".into());
    train.pod_uid = Some("ac04f3f2-1f2c-11e9-b015-1ebee232acfa".into());
    train.qos = Some("guaranteed".into());
    let squeezed = container(
        SQUEEZED_ID,
        "llm-serve",
        &[&serve],
        vec![region(2 * GIB, 2 * GIB - 64 * MIB, 42)],
    );
    let unlimited = container(
        UNLIMITED_ID,
        "notebook",
        &[&notebook],
        vec![region(0, 700 * MIB, 0)],
    );
    let host = container("host", "host", &[&blender], vec![]);

    let gpu = |index: u32, util: u32, used: u64| GpuDevice {
        index,
        uuid: Some(format!("GPU-{index}a2b3c4d-0000-1111-2222-333344445555")),
        name: Some("NVIDIA H100 80GB HBM3".into()),
        utilization_pct: Some(util),
        memory_used: Some(used),
        memory_total: Some(80 * GIB),
        power_mw: Some(310_000 + util * 2_000),
        temperature_c: Some(54),
    };
    Snapshot {
        schema: crate::model::SCHEMA.into(),
        hostname: "gpu-node-7".into(),
        taken_at_unix_ms: 1_780_000_000_000,
        interval_seconds: 1.0,
        driver_version: Some("580.65.06".into()),
        cuda_driver_version: Some("13.0".into()),
        agent: AgentStatus {
            probes_unavailable: None,
            attach_mode: Some(AttachMode::Multi),
            libraries: vec![LibraryStatus {
                path: "/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06".into(),
                attach_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06".into(),
                dev: 2049,
                inode: 1234,
                found_by: FoundBy::Host,
                symbols_attached: 61,
                symbols_missing: vec![],
                prologues: BTreeMap::new(),
                kinds_attached: vec!["alloc".into(), "free".into(), "sync".into()],
                processes_scoped: None,
            }],
            launch_probes: LaunchProbes::Sampled {
                window: std::time::Duration::from_secs(1),
                period: std::time::Duration::from_secs(10),
            },
            launch_probe_seconds: 12.0,
            probe_cost: Some(ProbeCost {
                target: "libcuda:cuDriverGetVersion".into(),
                prologue: Prologue::Push,
                calls: 20_000,
                unprobed_ns: 40.0,
                per_hit_ns: 1_700.0,
                inband_ns: 800.0,
                remeasured: 0,
                last_per_hit_ns: 1_700.0,
                charged_ns: BTreeMap::new(),
                charged_se_ns: BTreeMap::new(),
                charged_inband_ns: BTreeMap::new(),
                unpaired_hits: BTreeMap::new(),
                classes: Vec::new(),
                process_prologue: BTreeMap::new(),
            }),
            sampling: Some(crate::model::probing::SamplingStatus {
                budget_share: 0.005,
                window_seconds: 0.1,
                kinds: vec![
                    crate::model::probing::KindSampling {
                        kind: "sync".into(),
                        duty: 0.25,
                        overrun: 1.0,
                        rate_per_second: 8_000.0,
                        attached_seconds: 15.0,
                    },
                    crate::model::probing::KindSampling {
                        kind: "copy".into(),
                        duty: 1.0,
                        overrun: 1.0,
                        rate_per_second: 20.0,
                        attached_seconds: 60.0,
                    },
                ],
                exposure: BTreeMap::new(),
            }),
            events_lost: [("free_unknown".to_string(), 3u64)].into(),
            regions_read: 3,
            region_errors: 0,
            map_entries: BTreeMap::new(),
            nvml_problems: vec![],
            warnings: vec![],
            ..AgentStatus::default()
        },
        gpus: vec![gpu(0, 87, 11 * GIB), gpu(1, 12, 3 * GIB)],
        containers: vec![train, squeezed, unlimited, host],
        processes: vec![rank0, rank1, serve, notebook, blender],
    }
}

/// The same node with no NVIDIA driver: NVML not found, no GPUs, what probes and regions see.
pub fn no_driver() -> Snapshot {
    let mut s = snapshot();
    s.gpus.clear();
    s.driver_version = None;
    s.cuda_driver_version = None;
    s.agent.nvml_problems =
        vec!["NVML not found: libnvidia-ml.so.1 could not be loaded (no NVIDIA driver?)".into()];
    s
}

/// A node where nothing has used a GPU yet.
pub fn empty() -> Snapshot {
    let mut s = snapshot();
    s.containers.clear();
    s.processes.clear();
    s.agent.regions_read = 0;
    s
}

/// The squeezed container misconfigured: its 512 MiB limit is below the 544 MiB context charge
/// the limiter takes per process, so every allocation is denied and it holds nothing.
pub fn limit_below_context() -> Snapshot {
    let mut s = snapshot();
    let c = s
        .containers
        .iter_mut()
        .find(|c| c.key == SQUEEZED_ID)
        .expect("the squeezed container");
    c.regions[0].devices[0] = RegionDevice {
        index: 0,
        memory_limit: 512 * MIB,
        sm_limit_pct: 0,
        reserved: 0,
        denied: 148,
        context_charge: Some(544 * MIB),
        qos: None,
    };
    let p = s
        .processes
        .iter_mut()
        .find(|p| p.key.pid == 5200)
        .expect("its process");
    p.limiter = Some(limiter(0, 0));
    p.memory.limiter = Some(0);
    s
}

/// A node whose header counts lost events and errors: a region that cannot be read and a
/// warning.
pub fn with_errors() -> Snapshot {
    let mut s = snapshot();
    s.agent.events_lost = [
        ("free_unknown".to_string(), 17u64),
        ("return_without_entry".to_string(), 5),
        ("ring_full".to_string(), 0),
    ]
    .into();
    s.containers[0].regions.push(RegionInfo {
        path: "/var/lib/vgpu-agent/regions/pod-x/vgpu.cache".into(),
        format: "vgpu".into(),
        devices: vec![],
        problems: vec!["not a regular file (a FIFO): not read".into()],
        read_retries: 0,
        writable_by_others: None,
        freeze_after_seconds: None,
    });
    s.agent.region_errors = 1;
    s.agent.warnings = vec![
        "no libcuda on the host (searched /etc/ld.so.cache and the driver directories): no NVIDIA driver here? Watching processes for one".into(),
    ];
    s
}

/// A tenant flooding the agent: its processes map thousands of driver-named files that are not
/// drivers (skipped, their warnings past the bound suppressed), one of them holds its memory-map
/// lock (its maps read blocks) and more of its processes wait for a maps read; another tenant
/// has a process deferred by the budget.
pub fn with_skips() -> Snapshot {
    let mut s = snapshot();
    let a = &mut s.agent;
    let hostile = "7951fb549ab9c2d4e6f8a0b1c3d5e7f9a1b3c5d7e9f1a3b5c7d9e1f3a5b7c9d1";
    a.libraries_skipped.insert(
        hostile.into(),
        [
            ("mappings".to_string(), 4984u64),
            ("not_a_driver".to_string(), 8),
        ]
        .into(),
    );
    a.warnings_suppressed.insert(hostile.into(), 12);
    a.maps_scan = crate::model::MapsScanStatus {
        processes: 412,
        read: 37,
        bytes: 2 << 20,
        deferred: 10,
        deferred_by_tenant: [
            (hostile.to_string(), 9),
            ("/system.slice/cron.service".to_string(), 1),
        ]
        .into(),
        blocked: vec![crate::model::MapsBlocked {
            pid: 51234,
            tenant: hostile.into(),
            seconds: 12.3,
        }],
        cycle_seconds: 0.251,
        late_polls: 2,
    };
    s
}
