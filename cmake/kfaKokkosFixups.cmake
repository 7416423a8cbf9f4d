# The one place that copes with Debian's Trilinos packaging of Kokkos (3.4, from Trilinos 13).
# It is included after find_package(Kokkos) / find_package(KokkosKernels), both at build time and
# from the installed kfaConfig.cmake, and does nothing on a regular Kokkos 4 install.
#
# 1. Trilinos' Kokkos::kokkos names <prefix>/lib/include, which does not exist (the headers are in
#    <prefix>/include/trilinos, given by Kokkos_INCLUDE_DIRS). CMake rejects an imported target
#    with a missing include folder, so we point it at the right one.
# 2. Kokkos Kernels' target is called trilinos_kokkoskernels; Kokkos 4 installs call it
#    Kokkos::kokkoskernels. We provide the latter name so the rest of kfa uses one spelling.

if(TARGET Kokkos::kokkos)
  get_target_property(_kfa_kokkos_inc Kokkos::kokkos INTERFACE_INCLUDE_DIRECTORIES)
  set(_kfa_kokkos_inc_ok FALSE)
  foreach(_dir IN LISTS _kfa_kokkos_inc)
    if(EXISTS "${_dir}/Kokkos_Core.hpp")
      set(_kfa_kokkos_inc_ok TRUE)
    endif()
  endforeach()
  if(NOT _kfa_kokkos_inc_ok AND NOT _kfa_kokkos_inc MATCHES "\\$<")
    set(_kfa_good "")
    foreach(_dir IN LISTS Kokkos_INCLUDE_DIRS)
      get_filename_component(_dir "${_dir}" REALPATH)
      if(EXISTS "${_dir}/Kokkos_Core.hpp")
        list(APPEND _kfa_good "${_dir}")
      endif()
    endforeach()
    if(NOT _kfa_good)
      message(FATAL_ERROR "kfa: Kokkos::kokkos has no include folder with Kokkos_Core.hpp "
                          "(it names '${_kfa_kokkos_inc}', Kokkos_INCLUDE_DIRS='${Kokkos_INCLUDE_DIRS}')")
    endif()
    set_property(TARGET Kokkos::kokkos PROPERTY INTERFACE_INCLUDE_DIRECTORIES "${_kfa_good}")
    message(STATUS "kfa: repaired Kokkos::kokkos include folder (Trilinos packaging): ${_kfa_good}")
  endif()
endif()

# 3. With a Kokkos 4 chosen by Kokkos_ROOT, find_package(KokkosKernels) may still find Debian's
#    Trilinos build under /usr, made for Kokkos 3.4: linking both fails, so it is ignored.
if(TARGET trilinos_kokkoskernels AND Kokkos_VERSION VERSION_GREATER_EQUAL 4)
  if(NOT _kfa_warned_trilinos_kk)
    message(STATUS "kfa: ignoring Trilinos' Kokkos Kernels (built for Kokkos 3.4, not "
                   "${Kokkos_VERSION}); pass -DKokkosKernels_ROOT=... for a matching one")
    set(_kfa_warned_trilinos_kk TRUE)
  endif()
elseif(TARGET trilinos_kokkoskernels AND NOT TARGET Kokkos::kokkoskernels)
  add_library(Kokkos::kokkoskernels INTERFACE IMPORTED)
  set_property(TARGET Kokkos::kokkoskernels PROPERTY INTERFACE_LINK_LIBRARIES
                                                     trilinos_kokkoskernels Kokkos::kokkos)
endif()
