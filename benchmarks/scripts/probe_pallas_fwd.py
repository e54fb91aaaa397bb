"""One-off probe (2026-11-29): Pallas forward kernels vs chunk at one shape; times each kernel.

  PYTHONPATH=. python3 benchmarks/scripts/probe_pallas_fwd.py 4,4096,16 bfloat16
"""
import os, sys, time
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import warnings; warnings.filterwarnings("ignore")
import numpy as np, jax, jax.numpy as jnp
from sdm_jax.ops import gdn2, l2norm
from pallas_kernels.delta_rule_fwd import intra_chunk, state_pass
B,T,H = [int(x) for x in sys.argv[1].split(",")]
dt = jnp.dtype(sys.argv[2]); K=V=128
def log(*a): print(*a, flush=True)
def bench(f, *a, reps=10):
  t=time.perf_counter(); jax.block_until_ready(f(*a)); c=time.perf_counter()-t
  ts=[]
  for _ in range(reps):
    t=time.perf_counter(); jax.block_until_ready(f(*a)); ts.append(time.perf_counter()-t)
  return c, 1e3*float(np.median(ts))
r=np.random.default_rng(0)
q=l2norm(jnp.asarray(r.normal(size=(B,T,H,K)),jnp.float32)).astype(dt); k=l2norm(jnp.asarray(r.normal(size=(B,T,H,K)),jnp.float32)).astype(dt)
v=jnp.asarray(r.normal(size=(B,T,H,V)),dt); g=jax.nn.log_sigmoid(jnp.asarray(r.normal(size=(B,T,H,K))+3,jnp.float32))
b=jax.nn.sigmoid(jnp.asarray(r.normal(size=(B,T,H,K)),jnp.float32)).astype(dt); w=jax.nn.sigmoid(jnp.asarray(r.normal(size=(B,T,H,V)),jnp.float32)).astype(dt)
u,e,z=k,(b*k).astype(dt),(w*v).astype(dt); h0=jnp.zeros((B,H,K,V),jnp.float32)
log("shape",B,T,H,dt)
f1=jax.jit(lambda *a: intra_chunk(*a, scale=K**-0.5, chunk_size=64))
c,t1=bench(f1,q,u,e,z,g); log(f"intra_chunk compile+first {c:.1f}s  median {t1:.3f} ms")
y,wz,aqk=f1(q,u,e,z,g)
for bv,ns in [(32,1),(64,1),(16,1),(32,2)]:
  f2=jax.jit(lambda *a, bv=bv, ns=ns: state_pass(*a, scale=K**-0.5, chunk_size=64, block_v=bv, num_stages=ns))
  try:
    c,t2=bench(f2,q,u,g,y,wz,aqk,h0); log(f"state_pass bv={bv} st={ns} compile+first {c:.1f}s median {t2:.3f} ms")
  except Exception as ex: log("state_pass", bv, ns, "ERR", str(ex)[:150])
fc=jax.jit(lambda *a: gdn2(*a, impl="chunk", output_final_state=True))
fp=jax.jit(lambda *a: gdn2(*a, impl="pallas", output_final_state=True))
oc,sc=fc(q,k,v,g,b,w); op,sp=fp(q,k,v,g,b,w)
rel=lambda a,b: float(jnp.linalg.norm(a.astype(jnp.float32)-b.astype(jnp.float32))/jnp.linalg.norm(b.astype(jnp.float32)))
log("pallas vs chunk: o", rel(op,oc), "S", rel(sp,sc))
log("chunk fwd ms", bench(fc,q,k,v,g,b,w)[1], "pallas fwd ms", bench(fp,q,k,v,g,b,w)[1])
