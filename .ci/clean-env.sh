# Sourced by .ci/run (bash): clears a caller's environment of what would steer
# CI away from its clone, and says what it cleared (tests/install/test_ci_env.py).
# CI's own settings only. A caller's variables of ours, of the MPIs, of Theano
# and of a Python venv would reach every phase (root's directly, the user's
# through as_user) and point the clone at another tree's caches, venv or
# mpiexec (once: a CI started from a shell that had exported a working copy's
# cache folder). pip's settings stay (the machine's mirror, if any).
cleared=()
for var in $(compgen -e); do
    case $var in
        THEANOMPI_EXT_*|TMX_*|POCL_*|THEANO_FLAGS|THEANORC|PYTHONPATH|PYTHONHOME|\
        PYTHONSTARTUP|PYTHONUSERBASE|VIRTUAL_ENV|OMPI_*|PRTE_*|PMIX_*|MPIR_CVAR_*|\
        HYDRA_*|MPIEXEC_*|I_MPI_*|FI_*|UCX_*)
            cleared+=("$var"); unset "$var";;
    esac
done
# and no Python venv's folder on PATH (its python or mpiexec would come first)
path=
IFS=: read -ra dirs <<< "$PATH"
for dir in "${dirs[@]}"; do
    if [ -z "$dir" ] || [ -e "$dir/../pyvenv.cfg" ]; then cleared+=("PATH:$dir"); continue; fi
    path=${path:+$path:}$dir
done
export PATH=$path
[ ${#cleared[@]} -eq 0 ] || echo "CI: cleared from the caller's environment: ${cleared[*]}"
unset cleared path dirs dir
