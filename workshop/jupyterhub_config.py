# JupyterHub configuration of the course's workshop mode. Started by `make workshop`
# (workshop/run.py), which sets the variables below; see workshop/plan.py for the plan and
# docs/workshop.md for the whole picture.
#
#   WORKSHOP_CODE, WORKSHOP_ADMIN_CODE  the learners' sign-up code and the admin's password
#   WORKSHOP_ADMIN                      the admin's name (default host)
#   WORKSHOP_STATE                      the hub's own files (database, cookie secret, passwords)
#   WORKSHOP_HOMES                      where learners' home folders go (default /home)
#   WORKSHOP_GROUP                      the group of every workshop account (gpulab-learners)
#   WORKSHOP_IP, WORKSHOP_PORT          where learners connect (default 0.0.0.0:8000)
#   WORKSHOP_TRUSTED_PROXIES            reverse proxies in front of the hub's (e.g. an HTTPS
#                                       nginx), each adding to X-Forwarded-For (default 0)
#   WORKSHOP_HUB_PORT, WORKSHOP_PROXY_API_PORT, WORKSHOP_PROGRESS_PORT  internal, on 127.0.0.1
#   and the plan's WORKSHOP_DEVICES, _LEARNERS, _SIGNUPS, _GPU_MEMORY_FRACTION, _THREADS,
#   _KERNEL_IDLE_S, _SERVER_IDLE_S, _MEMORY, _TASKS, _SCRATCH, _DISK, _WALLS (workshop/plan.py).
import atexit
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import homes  # noqa: E402
import hub   # noqa: E402
import plan  # noqa: E402
import walls  # noqa: E402

c = get_config()  # noqa: F821 (provided by JupyterHub)
env = os.environ
ROOT = HERE.parent
VENV_BIN = Path(sys.executable).parent          # the hub runs from the course's venv
STATE = Path(env["WORKSHOP_STATE"])
COURSE = ROOT / "notebooks"                      # the self-study release, self-checks included
settings = plan.settings_from_env()

# Where the hub listens; its database and secrets. The hub's own port, on 127.0.0.1, takes
# X-Forwarded-For only from connections root owns: the proxy's (hub.client_address).
c.JupyterHub.ip = env.get("WORKSHOP_IP", "0.0.0.0")
c.JupyterHub.port = int(env.get("WORKSHOP_PORT", "8000"))
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = int(env.get("WORKSHOP_HUB_PORT", "8081"))
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.JupyterHub.cleanup_servers = True      # stopping the hub stops every learner's server
c.ConfigurableHTTPProxy.command = [str(HERE / "node_modules" / ".bin" / "configurable-http-proxy")]
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{env.get('WORKSHOP_PROXY_API_PORT', '8001')}"
c.ConfigurableHTTPProxy.pid_file = str(STATE / "proxy.pid")

# 1. Accounts: sign up with the workshop code; one system account per learner.
c.JupyterHub.authenticator_class = hub.WorkshopAuthenticator
admin = env.get("WORKSHOP_ADMIN", "host")
c.Authenticator.admin_users = {admin}
c.Authenticator.allow_all = True                 # anyone with the workshop code may sign up
c.Authenticator.username_pattern = hub.NAME_PATTERN
c.JupyterHub.template_paths = [str(HERE / "templates")]   # sign-in and sign-up pages
c.JupyterHub.default_url = hub.landing_url       # the host on the Admin page, learners on theirs
c.LocalAuthenticator.create_system_users = True
c.WorkshopAuthenticator.workshop_code = env["WORKSHOP_CODE"]
c.WorkshopAuthenticator.admin_code = env["WORKSHOP_ADMIN_CODE"]
c.WorkshopAuthenticator.passwords_file = str(STATE / "learners.json")
c.WorkshopAuthenticator.home_root = env.get("WORKSHOP_HOMES", "/home")
c.WorkshopAuthenticator.group = env.get("WORKSHOP_GROUP", hub.GROUP)
c.WorkshopAuthenticator.open_places = settings.signups
c.WorkshopAuthenticator.proxies_in_front = int(env.get("WORKSHOP_TRUSTED_PROXIES", "0"))
# Each home a disk of its own, where this machine can give one (run.py warns where it cannot).
if homes.why_not(Path(c.WorkshopAuthenticator.home_root)) is None:
    c.WorkshopAuthenticator.home_bytes = settings.disk_bytes
# No more servers at once than the plan shares the machine among.
c.JupyterHub.active_server_limit = settings.learners

# 2 and 3. Each learner's server: their account, GPU, memory cap, threads; idle kernels culled.
c.JupyterHub.spawner_class = hub.WorkshopSpawner
hub.WorkshopSpawner.settings = settings
if settings.walls:       # run.py has checked that this machine has a way (workshop/walls.py)
    applier, _ = walls.detect(env.get("WORKSHOP_GROUP", hub.GROUP))
    applier.prepare(settings.learners)
    atexit.register(applier.finish)
    hub.WorkshopSpawner.walls = applier
# What every learner's processes read: the Python, the venv, the course's library, the release
# they copy, and the workshop's server config and start page. Nothing else of the checkout.
NEEDED = [Path(sys.base_prefix).resolve(), VENV_BIN.parent, ROOT / "gpulab", COURSE, HERE]
hide, reveal = hub.reveal_plan(NEEDED)
hub.WorkshopSpawner.wrapper_env = {
    "GPULAB_WORKSHOP_COURSE": str(COURSE), "GPULAB_WORKSHOP_HIDE": hide,
    "GPULAB_WORKSHOP_REVEAL": reveal, "GPULAB_WORKSHOP_KEEP": ":".join(map(str, NEEDED)),
    "GPULAB_WORKSHOP_START_HERE": str(HERE / "START_HERE.md"),
    "PATH": f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin",
    # Kernels' connection files and Unix sockets (workshop/singleuser/): short paths, private.
    "JUPYTER_RUNTIME_DIR": "/tmp/jupyter-runtime",
    # Learners' servers leave nbgrader's pages out (workshop/singleuser/).
    "JUPYTER_CONFIG_PATH": str(HERE / "singleuser"),
}
c.Spawner.env_keep = ["LANG", "LC_ALL"]
hub.WorkshopSpawner.learner_cmd = [str(HERE / "start_learner.sh"),
                                   str(VENV_BIN / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab/tree/course/START_HERE.md"     # opens as a rendered page
c.Spawner.args = [
    f"--MappingKernelManager.cull_idle_timeout={settings.kernel_idle_s}",
    f"--MappingKernelManager.cull_interval={max(1, min(60, settings.kernel_idle_s // 4))}",
    # An open browser tab does not keep an idle kernel's GPU memory: culled all the same.
    "--MappingKernelManager.cull_connected=True",
]
# A room signing in at once on a busy machine: give the servers time to come up.
c.Spawner.start_timeout = 180
c.Spawner.http_timeout = 180

# 3. Idle servers stopped (jupyterhub-idle-culler); 5. the host's progress page.
progress_port = env.get("WORKSHOP_PROGRESS_PORT", "8002")
c.JupyterHub.services = [
    {"name": "idle-culler",
     "command": [sys.executable, "-m", "jupyterhub_idle_culler",
                 f"--timeout={settings.server_idle_s}",
                 f"--cull-every={max(1, min(300, settings.server_idle_s // 4))}"]},
    {"name": "progress", "url": f"http://127.0.0.1:{progress_port}", "display": True,
     "oauth_no_confirm": True,
     "command": [sys.executable, str(HERE / "progress.py")],
     "environment": {"GPULAB_WORKSHOP_COURSE": str(COURSE)}},
]
c.JupyterHub.load_roles = [
    {"name": "idle-culler", "services": ["idle-culler"],
     "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"]},
    {"name": "progress", "services": ["progress"],
     "scopes": ["list:users", "read:users", "read:servers"]},
    # Every learner may open the progress service, for chapter 12's leaderboard at
    # /services/progress/board; its progress table answers only the admin (workshop/progress.py).
    {"name": "user", "scopes": ["self", "access:services!service=progress"]},
]
