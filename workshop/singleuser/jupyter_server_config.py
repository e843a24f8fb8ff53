# A learner's server in workshop mode (JUPYTER_CONFIG_PATH points here, workshop/jupyterhub_config.py):
# nbgrader's pages stay out (the quizzes check themselves; labconfig/ leaves out its menu and
# JupyterLab's news prompt) and so does the language-server scan: 30 servers start at once, and
# nbgrader's import alone costs 1-2.5 s of CPU each.
# Set in traitlets config, which wins over the venv's jupyter_server_config.d files.
c = get_config()  # noqa: F821
c.ServerApp.jpserver_extensions = {
    "nbgrader.server_extensions.formgrader": False,
    "nbgrader.server_extensions.assignment_list": False,
    "nbgrader.server_extensions.course_list": False,
    "nbgrader.server_extensions.validate_assignment": False,
    "jupyter_lsp": False,   # no language servers are installed; it only scans for them
}
# A terminal is an interactive bash that keeps the server's PATH, the course's Python first, so
# `python -m gpulab doctor` works as the README says. (Left to itself, the terminal starts a
# login shell, whose /etc/profile resets PATH to the system's, where there is no `python`.)
c.ServerApp.terminado_settings = {"shell_command": ["/bin/bash", "-i"]}
# Kernels talk to the server over Unix sockets beside their connection files, in the learner's
# private /tmp (JUPYTER_RUNTIME_DIR, workshop/jupyterhub_config.py), not over TCP ports on
# 127.0.0.1: those every account can reach, and ten servers picking ports at once collide
# ("Address already in use", the kernel dies before it starts).
c.KernelManager.transport = "ipc"
