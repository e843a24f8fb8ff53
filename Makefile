# GPU Training Lab. The two commands: `make lab` (run the course) and `make test` (test it).
# Each sets up .venv on its own the first time; nothing has to be run before them.

PYTHON ?= python3
VENV   ?= .venv
# The torch requirement installed into a new venv. On a GPU server pick the build for your
# driver, e.g.  make lab TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126"
# A torch >= 2.13 (the course is tested with 2.13) that is already in the venv is kept.
TORCH  ?= torch==2.13.0
# Extra arguments for JupyterLab, e.g. LAB_ARGS="--no-browser --ip=0.0.0.0 --port=8888".
LAB_ARGS ?=
# Graded releases carry no self-checks: make release GRADED=1 (each student's own numbers when
# autograder/nbgrader_config.py sets a course seed: docs/teaching.md, "Per-student numbers").
GRADED ?=

READY := $(VENV)/.gpulab-ready
BIN   := $(VENV)/bin
# JupyterHub's proxy for workshop mode, from npm (workshop/package-lock.json pins it).
WORKSHOP_PROXY := workshop/node_modules/.bin/configurable-http-proxy

.PHONY: setup lab formgrader test release autograde feedback book bench gpu-check doctor clean screenshots \
	workshop workshop-check workshop-remove-learners

setup: $(READY)

$(READY): pyproject.toml scripts/setup_venv.sh
	@scripts/setup_venv.sh "$(PYTHON)" "$(VENV)" "$(TORCH)"

# The learner's JupyterLab (make lab) and the instructor's (make formgrader, docs/teaching.md):
# the same course, each with its settings in lab/. Only the instructor's has nbgrader's tools
# and reads its configuration (autograder/); the learner's writes nothing into autograder/.
# Containers and cloud machines often run as root, which Jupyter refuses unless told.
# nbgrader runs `alembic` by name when the Formgrader first opens its gradebook: the venv's bin/
# goes first on PATH. (tests/test_browser.py starts both labs with these same command lines.)
LEARNER_CONFIG    := $(CURDIR)/lab/learner:$(CURDIR)/lab
INSTRUCTOR_CONFIG := $(CURDIR)/lab/instructor:$(CURDIR)/autograder:$(CURDIR)/lab
LAB_COMMAND = PATH="$(abspath $(BIN)):$$PATH" \
	$(BIN)/jupyter lab --ServerApp.root_dir="$(CURDIR)" --LabApp.default_url=/lab/tree/notebooks \
	$(if $(filter 0,$(shell id -u)),--allow-root)

lab: $(READY)
	JUPYTER_CONFIG_PATH="$(LEARNER_CONFIG)" $(LAB_COMMAND) $(LAB_ARGS)

formgrader: $(READY)
	JUPYTER_CONFIG_PATH="$(INSTRUCTOR_CONFIG)" $(LAB_COMMAND) $(LAB_ARGS)

# Unit tests, the nbgrader round trip, the browser tests and the book, on 2 workers. Each chapter
# runs whole once: with the solution's worked answers, graded in the sandbox, experiments included
# (tests/test_pipeline.py: Run All must reach the last cell and score full marks); the book build
# executes chapter 08's page (tests/test_book.py; `make book` executes them all), and chapter
# 08's untouched release also runs top to bottom in JupyterLab (tests/test_browser.py).
# One thread per PyTorch process: two workers each running kernels with a thread per core would
# oversubscribe the cores, and OpenMP's waiting threads then slow every step several-fold.
test: $(READY) $(WORKSHOP_PROXY)
	@scripts/need_system_package.sh bwrap bubblewrap "the grading sandbox"
	@scripts/need_system_package.sh chromium chromium "the browser tests and make screenshots"
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --dist loadscope --no-loadscope-reorder tests

doctor: $(READY)
	$(BIN)/python -m gpulab doctor

# Instructor workflow (docs/teaching.md).
release: $(READY)
	$(BIN)/python autograder/release.py $(if $(GRADED),--graded)

autograde: $(READY)
	@scripts/need_system_package.sh bwrap bubblewrap "the grading sandbox"
	$(BIN)/python autograder/grade.py

# After manual grading in the Formgrader: feedback and CSV again, without re-running notebooks.
feedback: $(READY)
	$(BIN)/python autograder/grade.py --feedback-only

# The course as a static site in book/_build/html (offline; warnings are errors).
book: $(READY)
	$(BIN)/python scripts/build_book.py

bench: $(READY)
	$(BIN)/python scripts/bench.py

# PNGs of each chapter's key views (a quiz with its feedback, the main plot, the calculator) in
# book/screenshots/, taken in JupyterLab with the browser tests' driver (Chromium + Playwright).
screenshots: $(READY)
	@scripts/need_system_package.sh chromium chromium "the browser tests and make screenshots"
	OMP_NUM_THREADS=1 $(BIN)/python scripts/screenshots.py

# Workshop mode (docs/workshop.md): one JupyterHub for a room of learners on this
# machine, as root. Settings are variables, e.g. make workshop WORKSHOP_LEARNERS=30
# WORKSHOP_DEVICES=MIG-...,MIG-... (workshop/plan.py lists them all).
$(WORKSHOP_PROXY): workshop/package-lock.json
	@scripts/need_system_package.sh npm npm "workshop mode's proxy (configurable-http-proxy)"
	npm ci --prefix workshop --no-audit --no-fund --loglevel=error
	@touch $@

workshop: $(READY) $(WORKSHOP_PROXY)
	$(BIN)/python workshop/run.py

workshop-check: $(READY)
	$(BIN)/python workshop/check.py

workshop-remove-learners: $(READY)
	$(BIN)/python workshop/run.py --remove-learners

gpu-check: $(READY)
	$(BIN)/python scripts/gpu_check.py

clean:
	rm -rf autograder/autograded autograder/feedback autograder/graded_release \
	    autograder/gradebook.db autograder/grades.csv .pytest_cache book/_build book/chapters
