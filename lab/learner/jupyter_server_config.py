"""The learner's lab (`make lab`): no instructor tools, and nothing written into autograder/.

nbgrader's server extensions stay off (its Formgrader created autograder/gradebook.db the moment
it opened), and so do its lab extensions (labconfig/page_config.json: the Nbgrader menu, the
Create Assignment sidebar, the Validate button, the assignment and course lists).
Traitlets configuration wins over the venv's jupyter_server_config.d files, which enable them all.
"""
import os

c = get_config()  # noqa: F821 (provided by traitlets when it loads this file)

COURSE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
c.ServerApp.jpserver_extensions = {
    "nbgrader.server_extensions.formgrader": False,
    "nbgrader.server_extensions.assignment_list": False,
    "nbgrader.server_extensions.course_list": False,
    "nbgrader.server_extensions.validate_assignment": False,
}
# The learner's own workspace (open tabs, layout), not the one in ~/.jupyter that any other lab
# of this user saves into: a Formgrader tab left by `make formgrader` is never restored here.
c.LabApp.workspaces_dir = os.path.join(COURSE, ".lab-workspaces", "learner")
