"""The instructor's lab (`make formgrader`): nbgrader's tools on (the venv enables them), its
configuration read from autograder/ (the Makefile puts that folder on JUPYTER_CONFIG_PATH), and a
workspace of its own, so that its Formgrader tab never opens in the learner's lab."""
import os

c = get_config()  # noqa: F821 (provided by traitlets when it loads this file)

COURSE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
c.LabApp.workspaces_dir = os.path.join(COURSE, ".lab-workspaces", "instructor")
