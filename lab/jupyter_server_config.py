"""JupyterLab settings for both of the course's labs, the learner's (`make lab`) and the
instructor's (`make formgrader`); the Makefile puts this folder last on JUPYTER_CONFIG_PATH,
after the role's own folder (lab/learner/ or lab/instructor/).

Custom CSS is JupyterLab's own switch (LabApp.custom_css): every page then loads
<server>/custom/custom.css, which the server looks up in ServerApp.static_custom_path. That path
is not configurable by itself (it defaults to ~/.jupyter/custom/, the user's own folder), so it is
set through the web application's settings, which the server lets its configuration override.
"""
import os

c = get_config()  # noqa: F821 (provided by traitlets when it loads this file)

HERE = os.path.dirname(os.path.abspath(__file__))
c.LabApp.custom_css = True
c.ServerApp.tornado_settings = {"static_custom_path": [os.path.join(HERE, "custom")]}
